"""One device as the kubelet sees it, with what Allocate needs to hand it to a container.

Device IDs follow ``devicemodel.assignment`` so the extender's recorded choice and the kubelet's
IDs agree: a GPU's UUID, a MIG device's UUID, an EFA adapter's name, ``<gpu-uuid>::<kind>-<unit>``
for share units.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DeviceKind(StrEnum):
    """The device kinds gpuweave's own kinds make; a kind added later names its own word."""

    GPU = "gpu"
    MIG = "mig"
    EFA = "efa"
    COMPUTE = "compute"
    MEMORY = "memory"
    REPLICA = "replica"
    IMEX = "imex"


@dataclass(frozen=True)
class PluginDevice:
    """One device of one resource. ``kind`` is the word of the ``ResourceKind`` that made it."""

    id: str
    resource: str
    kind: str
    numa_node: int | None
    gpu_uuid: str | None = None  # the physical GPU behind a GPU, MIG or share device
    gpu_index: int | None = None
    unit: int = 0  # share unit number
    device_nodes: tuple[str, ...] = ()  # host device nodes handed to the container (EFA uverbs)
    pcie_switch: str | None = None


def numa_of(value: int) -> int | None:
    """NUMA node as sysfs reports it; -1 (unknown) becomes None so TopologyInfo is omitted."""
    return value if value >= 0 else None
