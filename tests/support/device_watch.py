"""Our own ListAndWatch stream of one resource, next to the kubelet's: every device list, in order.

The kubelet emulator keeps only the latest list; a test or benchmark that must see a short-lived
state (a GPU's shares withheld for a fraction of a second) reads every list from this stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from proto.v1beta1 import api_pb2
from tests.support.agent_node import AgentNode

Listed = Callable[[dict[str, str]], bool]  # a test on one device list (ID -> health)


class Watch:
    """Our own ListAndWatch stream of one resource: every list the agent sends, in order."""

    def __init__(self, node: AgentNode, resource: str) -> None:
        self.lists: list[dict[str, str]] = []
        self.times: list[float] = []  # when each list arrived (time.monotonic)
        self._cond = threading.Condition()
        self._stream: Any = node.kubelet.stub(resource).ListAndWatch(api_pb2.Empty())
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()

    def _consume(self) -> None:
        try:
            for response in self._stream:
                with self._cond:
                    self.lists.append({d.ID: d.health for d in response.devices})
                    self.times.append(time.monotonic())
                    self._cond.notify_all()
        except grpc.RpcError:
            pass

    def wait(self, predicate: Listed, *, start: int = 0, timeout: float = 20.0) -> int:
        """The index of the first list from ``start`` on that satisfies ``predicate``; -1 if none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for index in range(start, len(self.lists)):
                    if predicate(self.lists[index]):
                        return index
                left = deadline - time.monotonic()
                if left <= 0:
                    return -1
                self._cond.wait(min(left, 0.1))

    def close(self) -> None:
        self._stream.cancel()
        self._thread.join(5)
