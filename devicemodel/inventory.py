"""Inventory values: what a GPU node is made of, as frozen dataclasses.

Every part of gpuweave speaks in these values. Discovery (``hardware/``) produces a
``NodeInventory``; the topology graph, the device plugin, the MIG manager, health and the
scheduler extender consume it. They carry no behaviour beyond small derived properties, so
they are cheap to build in tests and safe to share between threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Architecture(StrEnum):
    """GPU architecture family, named as NVML's ``nvmlDeviceGetArchitecture`` names them."""

    KEPLER = "kepler"
    MAXWELL = "maxwell"
    PASCAL = "pascal"
    VOLTA = "volta"
    TURING = "turing"
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    UNKNOWN = "unknown"


class NicType(StrEnum):
    EFA = "efa"
    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"


@dataclass(frozen=True)
class PcieSwitch:
    """A PCIe switch below one host bridge (root complex); GPUs and NICs hang off switches.

    ``root_port`` names the host bridge's root port the switch hangs off where the switches of
    that host bridge use more than one; None for the one port all the others share. Switches on
    one root port meet below the host bridge (``PXB``), on different ones only at it (``PHB``).
    """

    name: str
    numa_node: int
    root: str  # host bridge / root complex identifier, e.g. "pci0000:00"
    root_port: str | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    pci_bus_id: str  # "00000000:53:00.0" as NVML prints it
    product: str  # "NVIDIA H100 80GB HBM3"
    architecture: Architecture
    compute_capability: str  # "9.0"
    memory_mib: int
    numa_node: int
    pcie_switch: str | None  # name of the PcieSwitch above the GPU; None when on a root port
    pcie_root: str  # host bridge the GPU sits under
    minor: int  # /dev/nvidia<minor>
    mig_capable: bool = False
    mig_enabled: bool = False

    @property
    def device_node(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class MigDevice:
    """One MIG device: a GPU instance plus one compute instance inside it."""

    uuid: str  # "MIG-xxxxxxxx-..."
    parent_uuid: str
    parent_index: int
    profile: str  # "1g.10gb", "3g.40gb", "1g.10gb+me"
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int  # first memory slot
    placement_size: int  # memory slots covered
    memory_mib: int
    compute_slices: int


@dataclass(frozen=True)
class Nic:
    name: str  # "rdmap16s27" / "efa_0"
    type: NicType
    pci_bus_id: str
    numa_node: int
    pcie_switch: str | None
    pcie_root: str
    uverbs_device: str | None = None  # "/dev/infiniband/uverbs0" for RDMA-capable adapters
    netdev: str | None = None


@dataclass(frozen=True)
class NvLink:
    """Direct NVLink connection between two GPUs (by index), ``links`` lanes wide."""

    gpu_a: int
    gpu_b: int
    links: int


@dataclass(frozen=True)
class DegradedLink:
    """An NVLink path between two GPUs (by index) that an active check measured below its threshold.

    NVML still reports every lane up, so discovery cannot see it: the node agent's peer-copy check
    found the pair slow (e.g. half its lanes trained) and publishes it in its inventory's status
    (``degradedLinks``). The two GPUs stay fine for any work that does not span the pair; work across
    it runs at ``fraction`` of the modelled NVLink bandwidth (``topology.graph``), and the pair no
    longer counts as NVLink-connected (``nvlink-required`` never gets it).
    """

    gpu_a: int
    gpu_b: int
    fraction: float  # measured / expected copy rate, 0..1
    reason: str = field(default="", compare=False)

    @property
    def pair(self) -> frozenset[int]:
        return frozenset((self.gpu_a, self.gpu_b))


@dataclass(frozen=True)
class NvSwitchFabric:
    """All listed GPUs reach each other through NVSwitches with ``links_per_gpu`` links each."""

    gpus: tuple[int, ...]
    links_per_gpu: int
    # The multi-node NVLink domain the switches belong to (a GB200/GB300 NVL72 rack's NVLink
    # partition), as every listed GPU's completed fabric reports it: "" and 0 for a single-node
    # board (HGX), whose GPUs report an all-zero cluster UUID.
    cluster_uuid: str = ""
    clique_id: int = 0

    @property
    def clique(self) -> str | None:
        """``<cluster UUID>.<clique ID>``, the value of GFD's ``nvidia.com/gpu.clique`` label; None
        without a multi-node domain."""
        return f"{self.cluster_uuid}.{self.clique_id}" if self.cluster_uuid else None


@dataclass(frozen=True)
class LostGpu:
    """A GPU the driver counts but cannot reach (off the bus): withheld, never offered.

    ``uuid`` comes from an earlier inventory when one is known, else it is empty; ``pci_bus_id``
    from the driver's last answer or the PCI tree, empty when neither names it.
    """

    index: int
    uuid: str
    pci_bus_id: str
    reason: str


@dataclass(frozen=True)
class NodeInventory:
    """Everything gpuweave knows about one node's accelerators and their interconnect."""

    name: str
    numa_nodes: int
    gpus: tuple[Gpu, ...]
    pcie_switches: tuple[PcieSwitch, ...] = ()
    nvlinks: tuple[NvLink, ...] = ()
    nvswitch: NvSwitchFabric | None = None
    nics: tuple[Nic, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""
    lost_gpus: tuple[LostGpu, ...] = ()  # counted by the driver, unreachable; not in ``gpus``
    # NVLink pairs an active check found slow (health, not hardware: the published status carries
    # them, ``status.degradedLinks``; discovery never fills this)
    degraded_links: tuple[DegradedLink, ...] = ()
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"node {self.name} has no GPU with index {index}")

    def gpu_by_uuid(self, uuid: str) -> Gpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(f"node {self.name} has no GPU with UUID {uuid}")

    def degraded_fraction(self, a: int, b: int) -> float | None:
        """The share of its bandwidth the pair keeps when an active check found it slow, else None."""
        pair = frozenset((a, b))
        found = [link.fraction for link in self.degraded_links if link.pair == pair]
        return min(found) if found else None

    def mig_devices_of(self, gpu_index: int) -> tuple[MigDevice, ...]:
        return tuple(m for m in self.mig_devices if m.parent_index == gpu_index)
