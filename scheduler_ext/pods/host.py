"""Host CPU and memory as kube-scheduler counts them: a node's allocatable, a pod's requests.

The scorer needs them because a GPU on a node whose CPU or memory is spent is a GPU no task can
use: FGD's fragment counts it, and placing a share there or elsewhere changes what stays usable.
kube-scheduler's NodeResourcesFit still decides whether a pod fits; the extender only scores.
A pod's request is kube-scheduler's: the sum over app containers or the largest init container,
whichever is larger, per resource; requests default to limits. Unreadable values count 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE]|m)?$")
_SCALE = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18} | {
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
MIB = 2**20
HostRequest = tuple[int, int]  # (CPU milli, memory MiB)
NO_HOST: HostRequest = (0, 0)


def amount(value: object) -> float:
    """A Kubernetes quantity in base units (cores, bytes); 0 when absent or unreadable."""
    match = _QUANTITY.match(str(value).strip()) if value is not None else None
    if match is None:
        return 0.0
    return float(match.group(1)) * _SCALE.get(match.group(2) or "", 1.0)


def _container(container: object) -> tuple[int, int]:
    if not isinstance(container, Mapping):
        return 0, 0
    resources = container.get("resources")
    resources = resources if isinstance(resources, Mapping) else {}
    values: dict[str, object] = {}
    for section in ("limits", "requests"):  # requests win; a missing request defaults to the limit
        found = resources.get(section)
        if isinstance(found, Mapping):
            values.update(found)
    return round(amount(values.get("cpu")) * 1000), int(amount(values.get("memory")) // MIB)


def host_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's (CPU milli, memory MiB) request as NodeResourcesFit counts it."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    app = [_container(c) for c in spec.get("containers") or [] if c]
    init = [_container(c) for c in spec.get("initContainers") or [] if c]
    return (
        max(sum(c for c, _ in app), max((c for c, _ in init), default=0)),
        max(sum(m for _, m in app), max((m for _, m in init), default=0)),
    )


def host_allocatable(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """A Node object's allocatable (CPU milli, memory MiB); None when it states neither."""
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or ("cpu" not in allocatable and "memory" not in allocatable):
        return None
    return round(amount(allocatable.get("cpu")) * 1000), int(amount(allocatable.get("memory")) // MIB)
