"""A pod's requests parsed once, for the verbs that see it in turn.

kube-scheduler sends the same pod to filter, then prioritize, and names it in bind (which reads
the object filter remembered); each verb parsed its containers' resources, its host requests and
its soft preferences again. The parse is kept per pod UID for the last ``MAX_PODS`` pods, with
the parts of the object it was read from (spec, annotations, namespace and name): a later call
whose object differs in any of them (a resize, a client that reuses a UID) is parsed again, so a
kept parse is always the parse of the object at hand. Comparing two small dicts costs
microseconds; the parse cost tens. A pod without a UID is parsed every time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from scheduler_ext.decide.shortlist import weighs_soft_preferences
from scheduler_ext.decide.workload import request_shape
from scheduler_ext.pods.host import HostRequest, host_requests
from scheduler_ext.pods.requests import BadPodRequestError, PodRequest, pod_is_ours, pod_request
from topology.fragmentation import TaskShape

MAX_PODS = 4096


@dataclass(frozen=True)
class ParsedPod:
    ours: bool  # mentions a gpuweave resource or annotation (``pod_is_ours``)
    request: PodRequest | None  # None: ``error`` says why it cannot be parsed
    error: str
    host: HostRequest
    soft: bool  # carries a soft preference kube-scheduler weighs (``weighs_soft_preferences``)

    @cached_property
    def shape(self) -> tuple[TaskShape, int] | None:
        """``workload.pod_shape`` of the pod (None without a request), once for filter's learning
        and ranking and prioritize's reservation costs."""
        return request_shape(self.request, self.host) if self.request is not None else None

    def checked(self) -> PodRequest:
        """The request; raises ``BadPodRequestError`` for a pod that has none."""
        if self.request is None:
            raise BadPodRequestError(self.error)
        return self.request


def parse_pod(pod: Mapping[str, Any]) -> ParsedPod:
    request, error = None, ""
    try:
        request = pod_request(pod)
    except BadPodRequestError as exc:
        error = str(exc)
    return ParsedPod(pod_is_ours(pod), request, error, host_requests(pod), weighs_soft_preferences(pod))


class ParsedPods:
    """``parse_pod`` kept per pod UID, checked against the object at hand; thread-safe."""

    def __init__(self, size: int = MAX_PODS) -> None:
        self._size = size
        self._parsed: OrderedDict[str, tuple[tuple[object, ...], ParsedPod]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, pod: Mapping[str, Any]) -> ParsedPod:
        metadata = pod.get("metadata")
        if not isinstance(metadata, Mapping) or not isinstance(uid := metadata.get("uid"), str) or not uid:
            return parse_pod(pod)
        source = (
            pod.get("spec"),
            metadata.get("annotations"),
            metadata.get("namespace"),
            metadata.get("name"),
        )
        with self._lock:
            kept = self._parsed.get(uid)
            if kept is not None and kept[0] == source:
                self._parsed.move_to_end(uid)
                return kept[1]
        parsed = parse_pod(pod)
        with self._lock:
            self._parsed[uid] = (source, parsed)
            self._parsed.move_to_end(uid)
            while len(self._parsed) > self._size:
                self._parsed.popitem(last=False)
        return parsed
