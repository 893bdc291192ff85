"""Keep a container's devices of different resources together when nothing else ties them.

The kubelet allocates each resource of a container separately, one after the other, with no pod
identity; it admits one pod at a time. So the devices the agent just granted for one resource
are, within a short window, almost surely the same container's, and they say where its next
resource should come from:

- ``gpuweave.io/gpu-compute`` and ``gpuweave.io/gpu-memory``: the same GPU;
- ``vpc.amazonaws.com/efa`` after ``nvidia.com/gpu``: adapters on the GPUs' PCIe switches and
  NUMA node (a NIC on the GPU's switch is what GPUDirect RDMA wants).

Which resource sits beside which is its resource kind's (``ResourceKind.siblings``, asked through
the registry). Each record is used once. The extender's recorded assignment, when present, still wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from devicekinds.registry import KINDS, KindRegistry
from nodeagent.devices import PluginDevice

DEFAULT_WINDOW_S = 5.0


class SiblingGrants:
    def __init__(
        self,
        *,
        window: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        kinds: KindRegistry = KINDS,
    ) -> None:
        self._kinds = kinds
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[tuple[PluginDevice, ...], float]] = {}  # resource -> (devices, when)

    def remember(self, resource: str, devices: Sequence[PluginDevice]) -> None:
        if devices and self._kinds.is_sibling_target(resource):
            with self._lock:
                self._last[resource] = (tuple(devices), self._clock())

    def near(self, resource: str) -> tuple[PluginDevice, ...]:
        """The devices just granted to the resource this one should sit beside (used once)."""
        sibling = self._kinds.sibling_of(resource)
        if sibling is None:
            return ()
        with self._lock:
            record = self._last.get(sibling)
            if record is None or self._clock() - record[1] > self._window:
                return ()
            del self._last[sibling]
            return record[0]
