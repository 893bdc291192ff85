"""Between a validated ``NodeProfileSpec`` and a ``NodeInventory``, both ways.

Omitted fields are derived here, deterministically, so every simulated node built from one
profile gets the same PCI layout and distinct, stable UUIDs. The inverse fills every optional
field so a published spec reproduces the inventory exactly.
"""

from __future__ import annotations

import functools
import uuid
from typing import TYPE_CHECKING, Any

from devicemodel import inventory as inv

if TYPE_CHECKING:
    from devicemodel.spec import GpuSpec, NicSpec, NodeProfileSpec

_UUID_NAMESPACE = uuid.UUID("6d1c3a52-2f0e-4b7a-9a43-0c7f1e5b2a10")
FIRST_GPU_BUS = 0x10
FIRST_NIC_BUS = 0x80
MAX_GPUS = FIRST_NIC_BUS - FIRST_GPU_BUS
MAX_NICS = 0x100 - FIRST_NIC_BUS
RDMA_NIC_TYPES = frozenset({inv.NicType.EFA, inv.NicType.INFINIBAND})
UVERBS_PREFIX = "/dev/infiniband/uverbs"


def derived_gpu_uuid(node_name: str, index: int) -> str:
    """A stable GPU UUID for GPU ``index`` of node ``node_name`` (profiles may omit UUIDs)."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{index}')}"


def derived_mig_uuid(node_name: str, gpu_index: int, gpu_instance: int, compute_instance: int) -> str:
    key = f"{node_name}/gpu/{gpu_index}/gi/{gpu_instance}/ci/{compute_instance}"
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, key)}"


def derived_gpu_bus_id(index: int) -> str:
    return f"00000000:{FIRST_GPU_BUS + index:02X}:00.0"


def derived_nic_bus_id(position: int) -> str:
    return f"00000000:{FIRST_NIC_BUS + position:02X}:00.0"


def derived_switch_root(position: int) -> str:
    """Each PCIe switch sits under its own host bridge unless the profile says otherwise."""
    return f"pci{position // 16:04x}:{(position % 16) * 16:02x}"


def derived_numa_root(numa_node: int) -> str:
    """Host bridge of devices on a root port (no switch): one per NUMA node."""
    return f"pci{0x10 + numa_node:04x}:00"


@functools.lru_cache(maxsize=4096)  # identical machines repeat the same bus ids in every inventory
def normalize_bus_id(bus_id: str) -> str:
    """NVML's form: 8-digit domain, upper-case hex (``00000000:53:00.0``)."""
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def switch_roots(spec: NodeProfileSpec) -> dict[str, str]:
    """Host bridge of every PCIe switch, by switch name."""
    return {
        sw.name: sw.root if sw.root is not None else derived_switch_root(position)
        for position, sw in enumerate(spec.pcie_switches)
    }


def uverbs_numbers(spec: NodeProfileSpec) -> dict[str, str | None]:
    """The uverbs device of every NIC: explicit ones kept, the rest numbered in bus-id order."""
    result: dict[str, str | None] = {}
    taken: set[str] = set()
    for nic in spec.nics:
        if nic.uverbs is not None:
            result[nic.name] = nic.uverbs or None
            taken.add(nic.uverbs)
    number = 0
    bus_ids = nic_bus_ids(spec)
    for nic in sorted(spec.nics, key=lambda n: bus_ids[n.name]):
        if nic.uverbs is not None or nic.type not in RDMA_NIC_TYPES:
            result.setdefault(nic.name, None)
            continue
        while f"{UVERBS_PREFIX}{number}" in taken:
            number += 1
        result[nic.name] = f"{UVERBS_PREFIX}{number}"
        taken.add(f"{UVERBS_PREFIX}{number}")
    return result


def nic_netdev(nic: NicSpec, uverbs: str | None) -> str | None:
    """A plain Ethernet NIC (no RDMA) is its interface: netdev defaults to the NIC's name."""
    if nic.netdev is not None:
        return nic.netdev or None
    return nic.name if nic.type is inv.NicType.ETHERNET and uverbs is None else None


def nic_bus_ids(spec: NodeProfileSpec) -> dict[str, str]:
    return {
        nic.name: normalize_bus_id(nic.pci_bus_id) if nic.pci_bus_id else derived_nic_bus_id(position)
        for position, nic in enumerate(spec.nics)
    }


def gpu_bus_id(gpu: GpuSpec) -> str:
    return normalize_bus_id(gpu.pci_bus_id) if gpu.pci_bus_id else derived_gpu_bus_id(gpu.index)


def _root_of(item: GpuSpec | NicSpec, roots: dict[str, str]) -> str:
    if item.pcie_switch is not None:
        return roots[item.pcie_switch]
    return item.pcie_root if item.pcie_root is not None else derived_numa_root(item.numa_node)


def spec_to_inventory(spec: NodeProfileSpec, *, node_name: str) -> inv.NodeInventory:
    roots = switch_roots(spec)
    gpus = tuple(_gpu(g, roots, node_name=node_name) for g in sorted(spec.gpus, key=lambda g: g.index))
    uuids = {g.index: g.uuid for g in gpus}
    migs = tuple(
        inv.MigDevice(
            uuid=m.uuid or derived_mig_uuid(node_name, m.gpu, m.gpu_instance_id, m.compute_instance_id),
            parent_uuid=uuids[m.gpu],
            parent_index=m.gpu,
            profile=m.profile,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            placement_start=m.placement_start,
            placement_size=m.placement_size,
            memory_mib=m.memory_mib,
            compute_slices=m.compute_slices,
        )
        for m in sorted(spec.mig_devices, key=lambda m: (m.gpu, m.gpu_instance_id, m.compute_instance_id))
    )
    return inv.NodeInventory(
        name=node_name,
        numa_nodes=spec.numa_nodes,
        gpus=gpus,
        pcie_switches=_switches(spec, roots),
        nvlinks=tuple(
            sorted(
                (inv.NvLink(gpu_a=min(nl.gpus), gpu_b=max(nl.gpus), links=nl.links) for nl in spec.nvlinks),
                key=lambda nl: (nl.gpu_a, nl.gpu_b),
            )
        ),
        nvswitch=_fabric(spec),
        nics=_nics(spec, roots),
        mig_devices=migs,
        driver_version=spec.driver_version,
        cuda_driver_version=spec.cuda_driver_version,
    )


def _switches(spec: NodeProfileSpec, roots: dict[str, str]) -> tuple[inv.PcieSwitch, ...]:
    """The switches, each root port kept only where its host bridge's switches use several."""
    ports_per_root: dict[str, set[str | None]] = {}
    for sw in spec.pcie_switches:
        ports_per_root.setdefault(roots[sw.name], set()).add(sw.root_port)
    return tuple(
        inv.PcieSwitch(name=s.name, numa_node=s.numa_node, root=roots[s.name],
                       root_port=s.root_port if len(ports_per_root[roots[s.name]]) > 1 else None)
        for s in spec.pcie_switches
    )


def _nics(spec: NodeProfileSpec, roots: dict[str, str]) -> tuple[inv.Nic, ...]:
    bus_ids = nic_bus_ids(spec)
    uverbs = uverbs_numbers(spec)
    return tuple(
        inv.Nic(
            name=n.name,
            type=n.type,
            pci_bus_id=bus_ids[n.name],
            numa_node=n.numa_node,
            pcie_switch=n.pcie_switch,
            pcie_root=_root_of(n, roots),
            uverbs_device=uverbs[n.name],
            netdev=nic_netdev(n, uverbs[n.name]),
        )
        for n in sorted(spec.nics, key=lambda n: bus_ids[n.name])
    )


def _fabric(spec: NodeProfileSpec) -> inv.NvSwitchFabric | None:
    if spec.nvswitch is None:
        return None
    fabric = spec.nvswitch
    zero = not fabric.cluster_uuid or not int(fabric.cluster_uuid.replace("-", ""), 16)
    domain = "" if zero or fabric.cluster_uuid is None else fabric.cluster_uuid
    return inv.NvSwitchFabric(
        gpus=tuple(sorted(fabric.gpus)),
        links_per_gpu=fabric.links_per_gpu,
        cluster_uuid=domain,
        clique_id=(fabric.clique_id or 0) if domain else 0,
    )


def _gpu(gpu: GpuSpec, roots: dict[str, str], *, node_name: str) -> inv.Gpu:
    return inv.Gpu(
        index=gpu.index,
        uuid=gpu.uuid or derived_gpu_uuid(node_name, gpu.index),
        pci_bus_id=gpu_bus_id(gpu),
        product=gpu.product,
        architecture=gpu.architecture,
        compute_capability=gpu.compute_capability,
        memory_mib=gpu.memory_mib,
        numa_node=gpu.numa_node,
        pcie_switch=gpu.pcie_switch,
        pcie_root=_root_of(gpu, roots),
        minor=gpu.minor if gpu.minor is not None else gpu.index,
        mig_capable=gpu.mig_capable,
        mig_enabled=gpu.mig_enabled,
    )


def inventory_to_spec_dict(inventory: inv.NodeInventory) -> dict[str, Any]:
    """The wire mapping of an inventory with every optional field filled (exact inverse)."""
    return {
        "numaNodes": inventory.numa_nodes,
        "pcieSwitches": [
            {"name": s.name, "numaNode": s.numa_node, "root": s.root, "rootPort": s.root_port}
            for s in inventory.pcie_switches
        ],
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "product": g.product,
                "architecture": g.architecture.value,
                "computeCapability": g.compute_capability,
                "memoryMiB": g.memory_mib,
                "numaNode": g.numa_node,
                "pcieSwitch": g.pcie_switch,
                "migCapable": g.mig_capable,
                "pciBusId": g.pci_bus_id,
                "migEnabled": g.mig_enabled,
                "minor": g.minor,
                "pcieRoot": g.pcie_root,
            }
            for g in inventory.gpus
        ],
        "nvlinks": [{"gpus": [nl.gpu_a, nl.gpu_b], "links": nl.links} for nl in inventory.nvlinks],
        "nvswitch": (_nvswitch_dict(inventory.nvswitch) if inventory.nvswitch is not None else None),
        "nics": [
            {
                "name": n.name,
                "type": n.type.value,
                "numaNode": n.numa_node,
                "pcieSwitch": n.pcie_switch,
                "pciBusId": n.pci_bus_id,
                "uverbs": n.uverbs_device or "",
                "netdev": n.netdev or "",
                "pcieRoot": n.pcie_root,
            }
            for n in inventory.nics
        ],
        "migDevices": [
            {
                "gpu": m.parent_index,
                "uuid": m.uuid,
                "profile": m.profile,
                "gpuInstanceId": m.gpu_instance_id,
                "computeInstanceId": m.compute_instance_id,
                "placementStart": m.placement_start,
                "placementSize": m.placement_size,
                "memoryMiB": m.memory_mib,
                "computeSlices": m.compute_slices,
            }
            for m in inventory.mig_devices
        ],
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
    }


def _nvswitch_dict(fabric: inv.NvSwitchFabric) -> dict[str, Any]:
    wire: dict[str, Any] = {"gpus": list(fabric.gpus), "linksPerGpu": fabric.links_per_gpu}
    if fabric.cluster_uuid:
        wire |= {"clusterUuid": fabric.cluster_uuid, "cliqueId": fabric.clique_id}
    return wire
