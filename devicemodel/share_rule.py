"""Which GPU a share goes to: one rule for the extender and the node agent, fractional and time-sliced.

A container's share units (compute units, or time-sliced replicas) all come from one GPU. Among
the GPUs with room, take the one left with the least room (the tightest fit), ties to the lowest
GPU index: large holes stay whole for large requests. The extender ranks fractional choices by
the fragment increase first (FGD) and uses this rule among equals; the node agent, with no
workload to score against, uses it alone when no assignment was recorded for the pod.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

GpuKey = TypeVar("GpuKey", bound=Hashable)


def tightest_gpu(free: Mapping[GpuKey, int], need: int, *, index: Mapping[GpuKey, int]) -> GpuKey | None:
    """The GPU whose free units fit ``need`` most tightly (lowest ``index`` among equals), or None."""
    fitting = [gpu for gpu, units in free.items() if units >= need]
    if not fitting:
        return None
    return min(fitting, key=lambda gpu: (free[gpu], index[gpu]))
