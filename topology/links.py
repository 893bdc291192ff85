"""Pair link classes as ``nvidia-smi topo -m`` prints them, and a bandwidth model per class.

The classes order how close two devices are; the bandwidth model turns a class into GB/s
(unidirectional) so set scores can compare an NVLink pair with a PCIe pair on one scale.
The figures are published specifications and measurements (see each function); the few
ranking priors that are not measured are marked as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from devicemodel.inventory import Architecture


class LinkClass(StrEnum):
    """How two devices reach each other, best first.

    ``NVSWITCH`` is NVLink through an NVSwitch fabric; ``nvidia-smi`` prints it as ``NV#`` like a
    direct NVLink, and so do we (see ``PairLink.label``), but we keep the distinction so reports
    can show it and so baselines can model tools that ignore NVSwitch.
    """

    X = "X"  # the device itself
    NVLINK = "NVLINK"  # direct NVLink lanes between the two GPUs
    NVSWITCH = "NVSWITCH"  # NVLink through NVSwitches
    PIX = "PIX"  # at most one PCIe switch between them
    PXB = "PXB"  # several PCIe switches, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (the CPU's root complex)
    NODE = "NODE"  # between host bridges of one NUMA node
    SYS = "SYS"  # across NUMA nodes (QPI/UPI/xGMI)

    @property
    def rank(self) -> int:
        """0 for the closest class; NVLink and NVSwitch share a rank, as nvidia-smi shows them."""
        return _RANKS[self]

    @property
    def is_nvlink(self) -> bool:
        return self in (LinkClass.NVLINK, LinkClass.NVSWITCH)


_RANKS = MappingProxyType({
    LinkClass.X: 0,
    LinkClass.NVLINK: 1,
    LinkClass.NVSWITCH: 1,
    LinkClass.PIX: 2,
    LinkClass.PXB: 3,
    LinkClass.PHB: 4,
    LinkClass.NODE: 5,
    LinkClass.SYS: 6,
})


@dataclass(frozen=True)
class PairLink:
    """The link between two devices: its class and, for NVLink classes, the lane count.

    ``degraded``: an active check measured the pair's NVLink below its threshold
    (``devicemodel.inventory.DegradedLink``); the class and lanes stay as the hardware reports them,
    but the pair no longer counts as NVLink-connected (``nvlink_usable``) and its modelled
    bandwidth is scaled down (``TopologyGraph``).
    """

    link_class: LinkClass
    nvlinks: int = 0
    degraded: bool = False

    @property
    def label(self) -> str:
        """The cell ``nvidia-smi topo -m`` prints: ``X``, ``NV12``, ``NV18``, ``PIX`` ... ``SYS``."""
        if self.link_class.is_nvlink:
            return f"NV{self.nvlinks}"
        return self.link_class.value

    @property
    def is_nvlink(self) -> bool:
        return self.link_class.is_nvlink

    @property
    def nvlink_usable(self) -> bool:
        """NVLink- or NVSwitch-connected and not found slow: what ``nvlink-required`` accepts."""
        return self.link_class.is_nvlink and not self.degraded

    @property
    def via_nvswitch(self) -> bool:
        return self.link_class is LinkClass.NVSWITCH


# Bandwidth figures, GB/s unidirectional.
#
# NVLink per link: NVLink 1 (P100) 4 links = 80 -> 20 per link; NVLink 2 (V100) 6 links = 150 ->
# 25; NVLink 3 (A100) 12 links = 300 -> 25; NVLink 4 (H100/H200) 18 links = 450 -> 25; NVLink 5
# (B200) 18 links = 900 -> 50. Source: stas00/ml-engineering network/README.md; the DGX-1 V100
# figure (25 GB/s per link one way) also in Alibaba Cloud ACK "Overview of topology-aware GPU
# scheduling".
#
# PCIe x16 per generation: Gen3 16 (Alibaba Cloud ACK, DGX-1), Gen4 31, Gen5 63
# (ml-engineering network/README.md). The generation is inferred from the GPU architecture.
#
# Paths through the PCIe tree, as a fraction of the x16 line rate:
#   PIX 1.0  - a peer-to-peer transfer under one switch runs at line rate.
#   PXB 0.9  - ranking prior (not measured): more switches, same line rate, more hops.
#   PHB 0.8  - ranking prior (not measured): through the root complex.
#   NODE 0.65 - nccl-tests issue #178: an A100 ring crossing NODE reached 20 GB/s on Gen4 (20/31).
#   SYS 0.35 - NCCL src/graph/topo.h inter-socket figures: BDW_QPI 6 vs Gen3 16, SRP_QPI 22 vs
#              Gen5 63; the socket interconnect, not PCIe, is the bottleneck.
_PCIE_PATH_FACTOR = MappingProxyType({
    LinkClass.PIX: 1.0,
    LinkClass.PXB: 0.9,
    LinkClass.PHB: 0.8,
    LinkClass.NODE: 0.65,
    LinkClass.SYS: 0.35,
})

# NCCL's LOC_BW (src/graph/topo.h): a device talking to itself.
LOCAL_GBPS = 5000.0


def nvlink_gbps_per_link(architecture: Architecture) -> float:
    """Unidirectional GB/s of one NVLink lane for a GPU generation (see the table above)."""
    if architecture is Architecture.BLACKWELL:
        return 50.0
    if architecture is Architecture.PASCAL:
        return 20.0
    # Volta, Turing (bridges), Ampere and Hopper all run 25 GB/s per link; unknown parts get the
    # common figure rather than zero so a reported link still counts.
    return 25.0


def pcie_x16_gbps(architecture: Architecture) -> float:
    """Unidirectional GB/s of the GPU's PCIe x16 host link, by the generation its family ships with."""
    if architecture in (Architecture.HOPPER, Architecture.BLACKWELL):
        return 63.0  # Gen5
    if architecture in (Architecture.AMPERE, Architecture.ADA):
        return 31.0  # Gen4
    return 16.0  # Gen3 (Volta, Turing, Pascal and older)


def link_gbps(link: PairLink, *, architectures: tuple[Architecture, ...]) -> float:
    """Modelled unidirectional GB/s of ``link`` between devices of the given architectures.

    With mixed generations the slower end sets the rate. NVSwitch pairs get the GPU's full NVLink
    bandwidth (links per GPU x per-link rate), since the switch is non-blocking.
    """
    if link.link_class is LinkClass.X:
        return LOCAL_GBPS
    if link.link_class.is_nvlink:
        return link.nvlinks * min(nvlink_gbps_per_link(a) for a in architectures)
    return _PCIE_PATH_FACTOR[link.link_class] * min(pcie_x16_gbps(a) for a in architectures)
