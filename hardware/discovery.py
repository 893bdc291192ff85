"""Assemble a ``NodeInventory`` from per-GPU driver facts and the sysfs PCIe tree.

Kept apart from the NVML reader so the rules that decide the inventory's shape live in one
place: which PCIe switch a device hangs off (nearest switch upstream port), how switches are
named (``sw0``... in bus order unless named by the caller), which NICs count (RDMA adapters and
physical network functions), and how per-link NVLink readings become pairs and an NVSwitch fabric.
The order matches ``NodeProfileSpec.to_inventory``: GPUs by index, NICs by PCI bus id.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from devicemodel import inventory as inv
from hardware.sysfs import NVIDIA_VENDOR, PciDevice, RdmaDevice, SysfsReader, nvml_bus_id, sysfs_bdf

LOG = logging.getLogger(__name__)
_NETWORK_CLASS = 0x02
UNKNOWN_ROOT = "unknown"


@dataclass(frozen=True)
class MigFacts:
    uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int
    placement_size: int
    memory_mib: int
    compute_slices: int


@dataclass
class GpuFacts:
    """What the driver says about one GPU (``link_remotes``: remote bus id per active NVLink)."""

    index: int
    uuid: str
    pci_bus_id: str
    product: str
    architecture: inv.Architecture
    compute_capability: str
    memory_mib: int
    minor: int
    numa_node: int
    mig_capable: bool
    mig_enabled: bool
    mig_devices: tuple[MigFacts, ...] = ()
    link_remotes: list[str] = field(default_factory=list)
    # (cluster UUID, clique ID) of a completed multi-node NVLink fabric; None otherwise
    fabric_domain: tuple[str, int] | None = None


@dataclass(frozen=True)
class _Placement:
    root: str
    switch_port: str | None
    numa_node: int
    root_port: str | None = None


def assemble_inventory(
    *,
    node_name: str,
    gpus: list[GpuFacts],
    sysfs: SysfsReader,
    switch_names: Mapping[str, str],
    driver_version: str,
    cuda_driver_version: str,
    lost_gpus: tuple[inv.LostGpu, ...] = (),
    root_port_names: Mapping[str, str | None] | None = None,
) -> inv.NodeInventory:
    """``switch_names`` and ``root_port_names`` name switches (by upstream port) and root ports (by
    bdf) where the caller knows better names than ``sw<N>`` and the bdf (the simulator does)."""
    gpu_places = {g.index: _placement(sysfs.pci_device(sysfs_bdf(g.pci_bus_id)), g.numa_node) for g in gpus}
    nic_rows = _nics(sysfs)
    places = [*gpu_places.values(), *(p for _, p in nic_rows)]
    switches = _switches(sysfs, places, switch_names, root_port_names or {})
    names = {port: switch.name for port, switch in switches.items()}
    numa_nodes = max([len(sysfs.numa_nodes()), *(g.numa_node + 1 for g in gpus), 1])
    nvlinks, fabric = _links(gpus, unreachable={g.pci_bus_id for g in lost_gpus})
    return inv.NodeInventory(
        name=node_name,
        numa_nodes=numa_nodes,
        gpus=tuple(_gpu(g, gpu_places[g.index], names) for g in sorted(gpus, key=lambda g: g.index)),
        pcie_switches=tuple(switches.values()),
        nvlinks=nvlinks,
        nvswitch=fabric,
        nics=tuple(sorted((_nic(nic, place, names) for nic, place in nic_rows), key=lambda n: n.pci_bus_id)),
        mig_devices=tuple(_mig_devices(gpus)),
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        lost_gpus=lost_gpus,
    )


def _placement(device: PciDevice | None, numa_hint: int) -> _Placement:
    if device is None:
        return _Placement(UNKNOWN_ROOT, None, max(numa_hint, 0))
    numa = device.numa_node if device.numa_node >= 0 else max(numa_hint, 0)
    return _Placement(device.root, device.switch_upstream_port, numa, device.root_port)


def _switches(
    sysfs: SysfsReader, places: list[_Placement], switch_names: Mapping[str, str],
    root_port_names: Mapping[str, str | None],
) -> dict[str, inv.PcieSwitch]:
    """Switches above any GPU or NIC, in bus order, keyed by upstream port bdf; each names its
    root port only where its host bridge's switches hang off more than one."""
    ports = sorted({p.switch_port for p in places if p.switch_port is not None})
    first_below = {port: next(p for p in places if p.switch_port == port) for port in ports}
    root_ports: dict[str, set[str | None]] = {}
    for below in first_below.values():
        root_ports.setdefault(below.root, set()).add(below.root_port)
    found: dict[str, inv.PcieSwitch] = {}
    for position, port in enumerate(ports):
        below = first_below[port]
        device = sysfs.pci_device(port)
        numa = device.numa_node if device is not None and device.numa_node >= 0 else below.numa_node
        name = switch_names.get(port, f"sw{position}")
        shared = len(root_ports[below.root]) == 1
        root_port = None if shared else _root_port_name(below.root_port, root_port_names)
        found[port] = inv.PcieSwitch(name=name, numa_node=numa, root=below.root, root_port=root_port)
    return found


def _root_port_name(bdf: str | None, names: Mapping[str, str | None]) -> str | None:
    if bdf is None:
        return None
    return names.get(bdf, bdf)  # a name may be None: the root port the profile left unnamed


def _gpu(facts: GpuFacts, place: _Placement, names: Mapping[str, str]) -> inv.Gpu:
    return inv.Gpu(
        index=facts.index,
        uuid=facts.uuid,
        pci_bus_id=facts.pci_bus_id,
        product=facts.product,
        architecture=facts.architecture,
        compute_capability=facts.compute_capability,
        memory_mib=facts.memory_mib,
        numa_node=place.numa_node,
        pcie_switch=names.get(place.switch_port) if place.switch_port else None,
        pcie_root=place.root,
        minor=facts.minor,
        mig_capable=facts.mig_capable,
        mig_enabled=facts.mig_enabled,
    )


@dataclass(frozen=True)
class _NicRow:
    name: str
    type: inv.NicType
    bdf: str
    uverbs: str | None
    netdev: str | None


def _nics(sysfs: SysfsReader) -> list[tuple[_NicRow, _Placement]]:
    rdma = sysfs.rdma_devices()
    rows = [_rdma_row(d) for d in rdma]
    rdma_functions = {d.bdf for d in rdma}
    for interface in sysfs.net_interfaces():
        if interface.bdf is None or interface.bdf in rdma_functions:
            continue
        device = sysfs.pci_device(interface.bdf)
        if device is None or device.pci_class >> 16 != _NETWORK_CLASS or device.vendor == NVIDIA_VENDOR:
            continue
        rows.append(_NicRow(interface.name, inv.NicType.ETHERNET, interface.bdf, None, interface.name))
    return [(row, _placement(sysfs.pci_device(row.bdf), 0)) for row in rows]


def _rdma_row(device: RdmaDevice) -> _NicRow:
    if device.is_efa:
        kind = inv.NicType.EFA
    elif device.link_layer.lower() == "infiniband":
        kind = inv.NicType.INFINIBAND
    else:
        kind = inv.NicType.ETHERNET  # RoCE
    return _NicRow(device.name, kind, device.bdf, device.uverbs, device.netdev)


def _nic(row: _NicRow, place: _Placement, names: Mapping[str, str]) -> inv.Nic:
    return inv.Nic(
        name=row.name,
        type=row.type,
        pci_bus_id=nvml_bus_id(row.bdf),
        numa_node=place.numa_node,
        pcie_switch=names.get(place.switch_port) if place.switch_port else None,
        pcie_root=place.root,
        uverbs_device=row.uverbs,
        netdev=row.netdev,
    )


def _links(
    gpus: list[GpuFacts], *, unreachable: set[str]
) -> tuple[tuple[inv.NvLink, ...], inv.NvSwitchFabric | None]:
    """GPU pairs from links whose remote is a GPU; every other remote is an NVSwitch, except a GPU
    that no longer answers (its links lead nowhere usable, and it is no switch)."""
    by_bus = {g.pci_bus_id: g.index for g in gpus}
    seen: Counter[tuple[int, int]] = Counter()
    switch_links: dict[int, int] = {}
    for gpu in gpus:
        for remote in gpu.link_remotes:
            if remote in unreachable:
                continue
            peer = by_bus.get(remote)
            if peer is None:
                switch_links[gpu.index] = switch_links.get(gpu.index, 0) + 1
            elif peer != gpu.index:
                seen[(gpu.index, peer)] += 1
    pairs = []
    for a, b in sorted({(min(p), max(p)) for p in seen}):
        forward, backward = seen[(a, b)], seen[(b, a)]
        if forward != backward:  # a lane is usable only when both of its ends report it active
            LOG.warning("NVLink %d->%d has %d active links, %d->%d has %d", a, b, forward, b, a, backward)
        if min(forward, backward) > 0:
            pairs.append(inv.NvLink(gpu_a=a, gpu_b=b, links=min(forward, backward)))
    fabric = None
    if switch_links:
        if len(set(switch_links.values())) > 1:
            LOG.warning("GPUs have unequal NVSwitch link counts: %s", switch_links)
        lanes = min(switch_links.values())
        cluster, clique = _domain([g for g in gpus if g.index in switch_links])
        fabric = inv.NvSwitchFabric(
            gpus=tuple(sorted(switch_links)), links_per_gpu=lanes, cluster_uuid=cluster, clique_id=clique
        )
    return tuple(pairs), fabric


def _domain(gpus: list[GpuFacts]) -> tuple[str, int]:
    """The one multi-node NVLink domain every switch-attached GPU reports, ("", 0) otherwise.

    GPUs of one node that name different domains, or some none, are a fabric out of step (GFD
    refuses to label such a node too): the node is published without a clique, so no gang counts
    on multi-node NVLink there.
    """
    domains = {g.fabric_domain for g in gpus}
    if len(domains) != 1 or None in domains:
        if any(d is not None for d in domains):
            seen = sorted(map(str, domains))
            LOG.warning("GPUs report different NVLink domains, publishing none: %s", seen)
        return "", 0
    (domain,) = domains
    assert domain is not None
    return domain


def _mig_devices(gpus: list[GpuFacts]) -> list[inv.MigDevice]:
    found = [
        inv.MigDevice(
            uuid=m.uuid,
            parent_uuid=g.uuid,
            parent_index=g.index,
            profile=m.profile,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            placement_start=m.placement_start,
            placement_size=m.placement_size,
            memory_mib=m.memory_mib,
            compute_slices=m.compute_slices,
        )
        for g in gpus
        for m in g.mig_devices
    ]
    return sorted(found, key=lambda m: (m.parent_index, m.gpu_instance_id, m.compute_instance_id))
