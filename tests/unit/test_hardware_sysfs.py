"""SysfsReader over a hand-laid tree in the kernel's layout (independent of the simulator's writer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hardware.sysfs import SysfsReader, nvml_bus_id, sysfs_bdf


def _device(sys_dir: Path, path: str, *, vendor: int, device: int, pci_class: int, numa: int) -> Path:
    directory = sys_dir / "devices" / path
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in (("vendor", f"0x{vendor:04x}"), ("device", f"0x{device:04x}"),
                        ("class", f"0x{pci_class:06x}"), ("numa_node", str(numa))):
        (directory / name).write_text(value + "\n")
    link = sys_dir / "bus" / "pci" / "devices" / directory.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(directory, link.parent))
    return directory


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


@pytest.fixture
def reader(tmp_path: Path) -> SysfsReader:
    sys_dir = tmp_path / "sys"
    bridge = {"vendor": 0x1000, "device": 0xC010, "pci_class": 0x060400, "numa": 1}
    _device(sys_dir, "pci0000:48/0000:48:01.0", **bridge)
    _device(sys_dir, "pci0000:48/0000:48:01.0/0000:49:00.0", **bridge)
    _device(sys_dir, "pci0000:48/0000:48:01.0/0000:49:00.0/0000:4a:02.0", **bridge)
    _device(sys_dir, "pci0000:48/0000:48:01.0/0000:49:00.0/0000:4a:03.0", **bridge)
    _device(sys_dir, "pci0000:48/0000:48:01.0/0000:49:00.0/0000:4a:02.0/0000:53:00.0",
            vendor=0x10DE, device=0x2330, pci_class=0x030200, numa=1)
    efa = _device(sys_dir, "pci0000:48/0000:48:01.0/0000:49:00.0/0000:4a:03.0/0000:4f:00.0",
                  vendor=0x1D0F, device=0xEFA1, pci_class=0x020000, numa=1)
    mlx = _device(sys_dir, "pci0000:00/0000:00:02.0/0000:05:00.0",
                  vendor=0x15B3, device=0x101B, pci_class=0x020700, numa=-1)
    # An EFA under its kernel name and an mlx5 device; names must not decide which is EFA.
    _symlink(sys_dir / "class" / "infiniband" / "efa_0" / "device", efa)
    _symlink(sys_dir / "class" / "infiniband" / "rdmap5s0" / "device", mlx)
    (sys_dir / "class" / "infiniband" / "rdmap5s0" / "ports" / "1").mkdir(parents=True)
    (sys_dir / "class" / "infiniband" / "rdmap5s0" / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
    for number, ibdev in ((3, "efa_0"), (0, "rdmap5s0")):
        verbs = sys_dir / "class" / "infiniband_verbs" / f"uverbs{number}"
        verbs.mkdir(parents=True)
        (verbs / "ibdev").write_text(ibdev + "\n")
    netdev = mlx / "net" / "ib0"
    netdev.mkdir(parents=True)
    (netdev / "operstate").write_text("down\n")
    _symlink(sys_dir / "class" / "net" / "ib0", netdev)
    virtio = _device(
        sys_dir, "pci0000:00/0000:00:03.0", vendor=0x1AF4, device=0x1000, pci_class=0x020000, numa=0
    )
    (virtio / "virtio2" / "net" / "eth0").mkdir(parents=True)
    (virtio / "virtio2" / "net" / "eth0" / "operstate").write_text("up\n")
    _symlink(sys_dir / "class" / "net" / "eth0", virtio / "virtio2" / "net" / "eth0")
    (sys_dir / "devices" / "virtual" / "net" / "lo").mkdir(parents=True)
    _symlink(sys_dir / "class" / "net" / "lo", sys_dir / "devices" / "virtual" / "net" / "lo")
    for node in (0, 1):
        node_dir = sys_dir / "devices" / "system" / "node" / f"node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(f"{node * 8}-{node * 8 + 7}\n")
    (sys_dir / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    return SysfsReader(tmp_path)


def test_gpu_behind_a_switch_names_the_switch_upstream_port_and_host_bridge(reader: SysfsReader) -> None:
    gpu = reader.pci_device("0000:53:00.0")
    assert gpu is not None
    assert (gpu.vendor, gpu.device, gpu.pci_class, gpu.numa_node) == (0x10DE, 0x2330, 0x030200, 1)
    assert gpu.root == "pci0000:48" and gpu.switch_upstream_port == "0000:49:00.0"
    efa = reader.pci_device("0000:4f:00.0")
    assert efa is not None and efa.switch_upstream_port == gpu.switch_upstream_port


def test_device_on_a_root_port_has_no_switch_and_unknown_numa(reader: SysfsReader) -> None:
    mlx = reader.pci_device("0000:05:00.0")
    assert mlx is not None and mlx.switch_upstream_port is None and mlx.numa_node == -1
    assert reader.pci_device("0000:99:00.0") is None


def test_efa_is_found_by_vendor_and_device_id_and_paired_with_its_uverbs(reader: SysfsReader) -> None:
    efa = reader.efa_devices()
    assert [(d.name, d.bdf, d.uverbs, d.netdev) for d in efa] == [
        ("efa_0", "0000:4f:00.0", "/dev/infiniband/uverbs3", None)
    ]
    ib = {d.name: d for d in reader.rdma_devices()}["rdmap5s0"]
    assert not ib.is_efa and ib.link_layer == "InfiniBand"
    assert ib.uverbs == "/dev/infiniband/uverbs0" and ib.netdev == "ib0"


def test_network_interfaces_resolve_to_their_pci_function(reader: SysfsReader) -> None:
    interfaces = {i.name: i for i in reader.net_interfaces()}
    assert interfaces["eth0"].bdf == "0000:00:03.0" and interfaces["eth0"].operstate == "up"
    assert interfaces["ib0"].bdf == "0000:05:00.0" and interfaces["ib0"].operstate == "down"
    assert interfaces["lo"].bdf is None
    assert reader.operstate("ib0") == "down" and reader.operstate("nope") is None


def test_numa_nodes_and_cpus(reader: SysfsReader) -> None:
    assert reader.numa_nodes() == (0, 1)
    assert reader.numa_cpulist(1) == "8-15"
    assert reader.numa_cpulist(5) == ""


def test_an_empty_root_reads_as_nothing(tmp_path: Path) -> None:
    empty = SysfsReader(tmp_path)
    assert empty.numa_nodes() == () and empty.rdma_devices() == () and empty.net_interfaces() == ()
    assert empty.pci_devices() == ()


def test_bus_id_forms() -> None:
    assert sysfs_bdf("00000000:B8:00.0") == "0000:b8:00.0"
    assert nvml_bus_id("0000:b8:1c.0") == "00000000:B8:1C.0"
