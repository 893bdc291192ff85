"""Where a device sits in the PCIe tree, and the path class between two devices.

The classes are NVML's common-ancestor levels, as ``nvidia-smi topo -m`` prints them: ``PIX``
under one switch, ``PXB`` under different switches that meet below the host bridge (one root port),
``PHB`` through the host bridge (different root ports, or a device on a root port of its own),
``NODE`` between host bridges of one NUMA node, ``SYS`` across NUMA nodes. The topology graph and
the simulated driver (``nvmlDeviceGetTopologyCommonAncestor``) both use this one rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from devicemodel.inventory import Gpu, Nic, NodeInventory
from topology.links import LinkClass


@dataclass(frozen=True)
class PciePlace:
    numa_node: int
    switch: str | None
    root: str
    root_port: str | None = None  # the switch's root port (None: the one its host bridge shares)


def pcie_class(a: PciePlace, b: PciePlace) -> LinkClass:
    """The PCIe path class between two endpoints, as nvidia-smi names it."""
    if a.switch is not None and a.switch == b.switch:
        return LinkClass.PIX
    if a.root == b.root:
        on_switches = a.switch is not None and b.switch is not None
        return LinkClass.PXB if on_switches and a.root_port == b.root_port else LinkClass.PHB
    if a.numa_node == b.numa_node:
        return LinkClass.NODE
    return LinkClass.SYS


def place_of(device: Gpu | Nic, root_ports: dict[str, str | None]) -> PciePlace:
    """``root_ports``: each switch's root port by switch name (``switch_root_ports``)."""
    port = root_ports.get(device.pcie_switch) if device.pcie_switch is not None else None
    return PciePlace(device.numa_node, device.pcie_switch, device.pcie_root, port)


def switch_root_ports(inventory: NodeInventory) -> dict[str, str | None]:
    return {sw.name: sw.root_port for sw in inventory.pcie_switches}
