"""Keep a container's compute and memory shares on one GPU when nothing else ties them.

``gpuweave.io/gpu-compute`` and ``gpuweave.io/gpu-memory`` are two kubelet resources, allocated
one after the other with no pod identity. The kubelet admits one pod at a time and, for each
container, asks for each resource in turn (GetPreferredAllocation, then Allocate). So the GPU the
agent just gave one share resource is, within a short window, almost surely the GPU the same
container needs for the other: remember it and prefer it once. The extender's recorded
assignment, when present, still wins (it names both resources on one GPU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from topology.contracts import RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY

SIBLING = {RESOURCE_GPU_COMPUTE: RESOURCE_GPU_MEMORY, RESOURCE_GPU_MEMORY: RESOURCE_GPU_COMPUTE}
DEFAULT_WINDOW_S = 5.0


class ShareAffinity:
    def __init__(
        self, *, window: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, float]] = {}  # resource -> (GPU UUID, when)

    def remember(self, resource: str, gpu_uuid: str) -> None:
        if resource in SIBLING:
            with self._lock:
                self._last[resource] = (gpu_uuid, self._clock())

    def preferred_gpu(self, resource: str) -> str | None:
        """The GPU the sibling resource was just given (used once), or None."""
        sibling = SIBLING.get(resource)
        if sibling is None:
            return None
        with self._lock:
            record = self._last.get(sibling)
            if record is None or self._clock() - record[1] > self._window:
                return None
            del self._last[sibling]
            return record[0]
