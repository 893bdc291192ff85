"""Lay out a fake sysfs tree for a simulated node, with the real kernel's file layout.

Written under ``<root>/sys`` so ``SysfsReader(root)`` reads it exactly as it reads ``/sys``:

- ``devices/<host bridge>/<root port>/<switch upstream>/<switch downstream>/<device>/`` with
  ``vendor``, ``device``, ``class``, ``numa_node`` files; devices without a switch sit on a root
  port; ``bus/pci/devices/<bdf>`` are symlinks into that tree, as in the kernel. Switches that
  share a root port (the same ``root_port``, or none, under one host bridge) hang off the
  downstream ports of one more switch on it, as switches that meet below a host bridge do.
- ``devices/system/node/node<N>/cpulist``.
- ``class/infiniband/<ibdev>/device`` -> the adapter's PCI function, ``ports/1/link_layer``;
  ``class/infiniband_verbs/uverbs<N>/{ibdev,dev}``.
- ``<device>/net/<ifname>/operstate`` with ``class/net/<ifname>`` linking to it.

Bridge addresses are made up (free bus/device numbers); endpoints keep the inventory's bus ids.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from devicemodel.inventory import Nic, NicType, PcieSwitch
from hardware.simulated.dev_tree import write_fake_dev
from hardware.simulated.health_calls import write_fabric_manager
from hardware.simulated.node import SimulatedNode
from hardware.sysfs import EFA_VENDOR, NVIDIA_VENDOR, sysfs_bdf

CPUS_PER_NUMA_NODE = 48
_BRIDGE_CLASS = 0x060400
_GPU_CLASS = 0x030200
_ETHERNET_CLASS = 0x020000
_INFINIBAND_CLASS = 0x020700
_ROOT_PORT = (0x1022, 0x1483)  # AMD root port
_SWITCH_PORT = (0x1000, 0xC010)  # Broadcom PEX switch port
_MELLANOX = 0x15B3
_UVERBS_MAJOR, _UVERBS_MINOR_BASE = 231, 192
_GPU_DEVICE_IDS = {
    "NVIDIA H100 80GB HBM3": 0x2330,
    "NVIDIA A100-SXM4-40GB": 0x20B0,
    "NVIDIA A100-SXM4-80GB": 0x20B2,
    "NVIDIA A100 80GB PCIe": 0x20B5,
    "Tesla V100-SXM2-32GB": 0x1DB5,
    "NVIDIA L40S": 0x26B9,
}


@dataclass
class FakeSysfsLayout:
    """What the writer chose: each PCIe switch's upstream port (bdf -> switch name) and each root
    port above a switch (bdf -> the switches' ``root_port``, None for the shared one)."""

    switch_names: dict[str, str] = field(default_factory=dict)
    root_port_names: dict[str, str | None] = field(default_factory=dict)


class _Bridges:
    """Hands out bridge addresses that no endpoint uses."""

    def __init__(self, used: set[str]) -> None:
        self._used = used
        self._candidates = (f"0000:{bus:02x}:{dev:02x}.0" for bus in range(256) for dev in range(1, 32))

    def next(self) -> str:
        for bdf in self._candidates:
            if bdf not in self._used:
                self._used.add(bdf)
                return bdf
        raise RuntimeError("no free PCI address for a simulated bridge")


def write_fake_sysfs(root: Path, node: SimulatedNode) -> FakeSysfsLayout:
    """Write the tree for ``node`` under ``root/sys`` (root must be empty or fresh)."""
    sys_dir = Path(root) / "sys"
    inventory = node.inventory
    endpoints = [sysfs_bdf(g.pci_bus_id) for g in inventory.gpus]
    endpoints += [sysfs_bdf(n.pci_bus_id) for n in inventory.nics]
    files = _Files()
    tree = _TreeWriter(sys_dir, _Bridges(set(endpoints)), files)
    layout = FakeSysfsLayout()
    _write_switches(tree, inventory.pcie_switches, layout)
    for gpu in inventory.gpus:
        parent = tree.port_for(gpu.pcie_switch, gpu.pcie_root, numa=gpu.numa_node)
        ids = (NVIDIA_VENDOR, _GPU_DEVICE_IDS.get(gpu.product, 0x2300))
        tree.device(parent, sysfs_bdf(gpu.pci_bus_id), ids=ids, pci_class=_GPU_CLASS, numa=gpu.numa_node)
    for nic in inventory.nics:
        parent = tree.port_for(nic.pcie_switch, nic.pcie_root, numa=nic.numa_node)
        ids, pci_class = _nic_ids(nic)
        bdf = sysfs_bdf(nic.pci_bus_id)
        device_dir = tree.device(parent, bdf, ids=ids, pci_class=pci_class, numa=nic.numa_node)
        _write_nic_classes(files, sys_dir, nic, device_dir)
    if inventory.nvswitch is not None:
        write_fabric_manager(Path(root), running=node.health.fabric_state not in ("not-started", "failed"))
    for numa in range(inventory.numa_nodes):
        first = numa * CPUS_PER_NUMA_NODE
        cpulist = sys_dir / "devices" / "system" / "node" / f"node{numa}" / "cpulist"
        files.write(cpulist, f"{first}-{first + CPUS_PER_NUMA_NODE - 1}")
    write_fake_dev(Path(root), inventory)  # device nodes and their numbers (hardware.device_nodes)
    return layout


def _write_switches(tree: _TreeWriter, switches: tuple[PcieSwitch, ...], layout: FakeSysfsLayout) -> None:
    """A root port per (host bridge, root port) group; a group of several switches sits below the
    downstream ports of one more switch there (they meet below the host bridge: PXB). Written in
    the switches' order, so their upstream ports' bus order is theirs."""
    members = Counter((s.root, s.root_port) for s in switches)
    tops: dict[tuple[str, str | None], Path] = {}  # per group: its root port, or the hub on it
    for switch in switches:
        key, numa = (switch.root, switch.root_port), switch.numa_node
        if key not in tops:
            root_port = tree.bridge(tree.sys_dir / "devices" / switch.root, ids=_ROOT_PORT, numa=numa)
            layout.root_port_names[root_port.name] = switch.root_port
            tops[key] = tree.bridge(root_port, ids=_SWITCH_PORT, numa=numa) if members[key] > 1 else root_port
        parent = tops[key]
        if members[key] > 1:
            parent = tree.bridge(parent, ids=_SWITCH_PORT, numa=numa)  # a downstream port of the hub
        upstream = tree.bridge(parent, ids=_SWITCH_PORT, numa=numa)
        tree.switch_dirs[switch.name] = upstream
        layout.switch_names[upstream.name] = switch.name


class _TreeWriter:
    """Creates PCI device directories and their ``bus/pci/devices`` links."""

    def __init__(self, sys_dir: Path, bridges: _Bridges, files: _Files) -> None:
        self.sys_dir = sys_dir
        self.bridges = bridges
        self.files = files
        self.switch_dirs: dict[str, Path] = {}

    def port_for(self, switch: str | None, host_bridge: str, *, numa: int) -> Path:
        """A fresh downstream port of ``switch``, or a fresh root port under ``host_bridge``."""
        if switch is not None:
            return self.bridge(self.switch_dirs[switch], ids=_SWITCH_PORT, numa=numa)
        return self.bridge(self.sys_dir / "devices" / host_bridge, ids=_ROOT_PORT, numa=numa)

    def bridge(self, parent: Path, *, ids: tuple[int, int], numa: int) -> Path:
        return self.device(parent, self.bridges.next(), ids=ids, pci_class=_BRIDGE_CLASS, numa=numa)

    def device(self, parent: Path, bdf: str, *, ids: tuple[int, int], pci_class: int, numa: int) -> Path:
        directory = parent / bdf
        self.files.new_dir(directory)
        self.files.write(directory / "vendor", f"0x{ids[0]:04x}")
        self.files.write(directory / "device", f"0x{ids[1]:04x}")
        self.files.write(directory / "class", f"0x{pci_class:06x}")
        self.files.write(directory / "numa_node", str(numa))
        self.files.link(self.sys_dir / "bus" / "pci" / "devices" / bdf, directory)
        return directory


def _nic_ids(nic: Nic) -> tuple[tuple[int, int], int]:
    if nic.type is NicType.EFA:
        return (EFA_VENDOR, 0xEFA1), _ETHERNET_CLASS
    if nic.type is NicType.INFINIBAND:
        return (_MELLANOX, 0x101B), _INFINIBAND_CLASS
    return (_MELLANOX, 0x1017), _ETHERNET_CLASS


def _write_nic_classes(files: _Files, sys_dir: Path, nic: Nic, device_dir: Path) -> None:
    rdma = nic.type in (NicType.EFA, NicType.INFINIBAND) or nic.uverbs_device is not None
    if rdma:
        ib_dir = sys_dir / "class" / "infiniband" / nic.name
        files.new_dir(ib_dir)
        files.link(ib_dir / "device", device_dir)
        link_layer = {NicType.INFINIBAND: "InfiniBand", NicType.EFA: "Unspecified"}.get(nic.type, "Ethernet")
        files.write(ib_dir / "ports" / "1" / "link_layer", link_layer)
        if nic.type is NicType.EFA:
            _write_efa_counters(files, ib_dir)
    if rdma and nic.uverbs_device is not None:
        number = int(nic.uverbs_device.removeprefix("/dev/infiniband/uverbs"))
        verbs_dir = sys_dir / "class" / "infiniband_verbs" / f"uverbs{number}"
        files.write(verbs_dir / "ibdev", nic.name)
        files.write(verbs_dir / "dev", f"{_UVERBS_MAJOR}:{_UVERBS_MINOR_BASE + number}")
    if nic.netdev is not None:
        net_dir = device_dir / "net" / nic.netdev
        files.write(net_dir / "operstate", "up")
        files.link(sys_dir / "class" / "net" / nic.netdev, net_dir)


EFA_PORT_COUNTERS = (
    "tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs", "recv_bytes",
    "recv_wrs", "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes",
    "rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes", "retrans_bytes",
    "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events", "impaired_remote_conn_events",
)
EFA_DEVICE_COUNTERS = (
    "submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds", "keep_alive_rcvd", "alloc_pd_err",
    "create_qp_err", "create_cq_err", "reg_mr_err", "alloc_ucontext_err", "create_ah_err", "mmap_err",
    "lifespan",
)


def _write_efa_counters(files: _Files, ib_dir: Path) -> None:
    """The efa driver's counter files (Linux ``efa_verbs.c``), all zero on a fresh adapter."""
    for name in EFA_PORT_COUNTERS:
        files.write(ib_dir / "ports" / "1" / "hw_counters" / name, "0")
    for name in EFA_DEVICE_COUNTERS:
        files.write(ib_dir / "hw_counters" / name, "0")


class _Files:
    """Writes files and links, creating each parent directory once (remembered, not re-tried)."""

    def __init__(self) -> None:
        self._made: set[Path] = set()

    def new_dir(self, directory: Path) -> None:
        """A directory that must not exist yet (a second device at one address is a bug)."""
        self._parent(directory.parent)
        directory.mkdir()
        self._made.add(directory)

    def write(self, path: Path, text: str) -> None:
        self._parent(path.parent)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"{text}\n")

    def link(self, link: Path, target: Path) -> None:
        """A relative symlink, as sysfs uses, so the tree can be moved or read under any root."""
        self._parent(link.parent)
        link.symlink_to(os.path.relpath(target, link.parent))

    def _parent(self, directory: Path) -> None:
        if directory not in self._made:
            directory.mkdir(parents=True, exist_ok=True)
            self._made.add(directory)
