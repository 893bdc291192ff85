"""The devices a node publishes to DRA, from the same catalogue the device plugin serves.

Pure: ``dra_devices(inventory, mig=...)`` turns a ``NodeInventory`` into ``DraDevice`` values, each
with the DRA attributes and capacity it is published with and the device-plugin entry
(``nodeagent.devices.PluginDevice``) it stands for, so NodePrepareResources hands a container
exactly what Allocate would. Names are DNS labels, unique in the node's pool:

- ``gpu-<index>``: a whole GPU (not in MIG mode, or MIG-capable under ``MigPublishing.DYNAMIC``);
- ``gpu-<index>-mig-<gi>-<ci>``: a MIG device that exists (``MigPublishing.STATIC``);
- ``gpu-<index>-mig-<profile>-<start>``: a MIG placement that may be created (``DYNAMIC``), e.g.
  ``gpu-0-mig-3g-40gb-4``; it consumes the GPU's counters (``dradriver.slices``);
- ``efa-<adapter>``: an EFA adapter (its name lower-cased, other characters as ``-``);
- ``imex-channel-<N>``: the node's IMEX channel, on a node of a multi-node NVLink domain (a clique)
  only; one device, so the allocator gives it to one claim at a time (one job per node holds it);
- a GPU the driver counts but cannot reach keeps ``gpu-<index>``, with only ``type``, ``index`` and
  ``uuid``, and is tainted NoExecute (``dradriver.taints``).

Attributes (domain ``gpuweave.io`` unless named): ``type`` (gpu, mig, efa, imex-channel), ``uuid``,
``index``, ``productName``, ``architecture``, ``computeCapability`` (string "9.0"),
``cudaComputeCapability`` (version "9.0.0", for comparisons), ``driverVersion``, ``migCapable``,
``numaNode``, ``pcieSwitch``, ``nvlinkDomain``, ``nvlinkPeers``, ``nvswitch``; on a clique's GPUs
``clique``, ``cliqueID``, ``clusterUUID``; for MIG ``profile``, ``parentUUID``,
``placementStart``, ``placementSize``; for EFA ``name``; for the IMEX channel ``channel`` and the
same three clique attributes as its GPUs; and the standard
``resource.kubernetes.io/pcieRoot``, ``pciBusID`` and ``numaNode``. Capacity: ``memory`` (bytes, as
a quantity in Mi), and for MIG ``computeSlices`` and ``memorySlices``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import pairwise
from typing import Any

from devicekinds.registry import KINDS
from devicemodel.contracts import RESOURCE_IMEX_CHANNEL
from devicemodel.inventory import Gpu, LostGpu, MigDevice, Nic, NicType, NodeInventory
from devicemodel.sharing import SharingPlan
from hardware.mig_catalog import GiProfile, MigCatalogError, default_catalog
from nodeagent.devices import DeviceKind, PluginDevice, build_catalogue

DRIVER = "gpuweave.io"
STANDARD = "resource.kubernetes.io"
ATTR_TYPE = "type"
_UNSAFE = re.compile(r"[^a-z0-9]+")


class DraKind(StrEnum):
    GPU = "gpu"
    GPU_SHARE = "gpu-share"  # a fractional GPU, shared by claims through consumable capacity
    GPU_COMPUTE = "gpu-compute"  # one 1% unit of a fractional GPU (gpuweave.io/gpu-compute)
    GPU_MEMORY = "gpu-memory"  # one GiB unit of a fractional GPU (gpuweave.io/gpu-memory)
    MIG = "mig"
    EFA = "efa"
    IMEX_CHANNEL = "imex-channel"
    KIND = "kind"  # a device of a registry kind the DRA driver has no code of its own for


class MigPublishing(StrEnum):
    """How MIG-capable GPUs are published (``--dra-mig``; docs/dra.md).

    ``static``: what NVML shows: a GPU in MIG mode publishes its existing MIG devices, any other GPU
    the whole GPU. ``dynamic``: every MIG-capable GPU publishes shared counters (memory slices,
    compute slices), the whole GPU and every valid placement of every profile, all consuming them
    (KEP-4815 partitionable devices), so the scheduler picks a whole GPU or any slice that fits.
    """

    STATIC = "static"
    DYNAMIC = "dynamic"


@dataclass(frozen=True)
class DraDevice:
    """One published device and what it stands for on the node."""

    name: str
    kind: DraKind
    attributes: dict[str, dict[str, Any]] = field(hash=False)  # qualified name -> {"string": ...}
    capacity: dict[str, str] = field(hash=False)  # qualified name -> quantity
    plugin: PluginDevice | None  # None: a MIG placement that does not exist yet
    gpu_uuid: str | None = None  # the physical GPU behind a GPU or MIG device
    consumes: dict[str, int] = field(default_factory=dict, hash=False)  # counter -> amount
    counter_set: str | None = None  # the GPU's counter set it consumes from (partitionable only)
    lost: bool = False  # a GPU the driver counts but cannot reach: published tainted, never prepared
    mig_profile: str | None = None
    placement_start: int | None = None
    allow_multiple: bool = False  # consumable capacity: several claims share it (``dradriver.shares``)
    request_policy: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)  # capacity -> policy

    @property
    def health_keys(self) -> tuple[str, ...]:
        """The IDs the agent's health maps may hold for this device: its own, then its GPU's."""
        keys = [self.plugin.id] if self.plugin is not None else []
        if self.gpu_uuid and self.gpu_uuid not in keys:
            keys.append(self.gpu_uuid)
        return tuple(keys)


def dns_part(text: str) -> str:
    """Lower-case letters and digits, anything else one ``-``; trimmed of ``-`` at both ends."""
    return _UNSAFE.sub("-", text.lower()).strip("-")


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}-mig"


def _s(value: str) -> dict[str, Any]:
    return {"string": value}


def _version(text: str) -> dict[str, Any] | None:
    parts = [p for p in text.split(".") if p.isdigit()][:3]
    if not parts:
        return None
    parts += ["0"] * (3 - len(parts))
    return {"version": ".".join(str(int(p)) for p in parts)}


def _bdf(nvml_bus_id: str) -> str:
    """NVML's ``00000000:1B:00.0`` as the kernel's extended BDF ``0000:1b:00.0``."""
    domain, _, rest = nvml_bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}" if rest else nvml_bus_id.lower()


def _placement_attrs(
    numa_node: int, pcie_root: str, pcie_switch: str | None, bus_id: str
) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {f"{STANDARD}/pcieRoot": _s(pcie_root)}
    if bus_id:
        attrs[f"{STANDARD}/pciBusID"] = _s(_bdf(bus_id))
    if numa_node >= 0:  # unknown NUMA: not published, as the standard attribute asks
        attrs[f"{STANDARD}/numaNode"] = {"int": numa_node}
        attrs["numaNode"] = {"int": numa_node}
    if pcie_switch:
        attrs["pcieSwitch"] = _s(pcie_switch)
    return attrs


def nvlink_domains(inventory: NodeInventory) -> dict[int, tuple[str, int]]:
    """GPU index -> (domain id, peers): GPUs joined by NVLink or one NVSwitch fabric share a domain
    (connected components, numbered from the lowest GPU index); a GPU without NVLink has none."""
    neighbours: dict[int, set[int]] = {g.index: set() for g in inventory.gpus}
    links = [(a.gpu_a, a.gpu_b) for a in inventory.nvlinks]
    if inventory.nvswitch:
        fabric = [i for i in inventory.nvswitch.gpus if i in neighbours]
        links += list(pairwise(fabric))
    for a, b in links:
        if a in neighbours and b in neighbours and a != b:
            neighbours[a].add(b)
            neighbours[b].add(a)
    domains: dict[int, tuple[str, int]] = {}
    for start in sorted(neighbours):
        if start in domains or not neighbours[start]:
            continue
        component, todo = {start}, [start]
        while todo:
            for peer in neighbours[todo.pop()] - component:
                component.add(peer)
                todo.append(peer)
        domain = f"nvl{len({d for d, _ in domains.values()})}"
        for index in component:
            domains[index] = (domain, len(component) - 1)
    return domains


def _gpu_attrs(gpu: Gpu, inventory: NodeInventory, kind: DraKind) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        ATTR_TYPE: _s(kind.value),
        "index": {"int": gpu.index},
        "productName": _s(gpu.product),
        "architecture": _s(gpu.architecture.value),
        "computeCapability": _s(gpu.compute_capability),
        "migCapable": {"bool": gpu.mig_capable},
        **_placement_attrs(gpu.numa_node, gpu.pcie_root, gpu.pcie_switch, gpu.pci_bus_id),
    }
    for name, text in (
        ("cudaComputeCapability", gpu.compute_capability),
        ("driverVersion", inventory.driver_version),
    ):
        version = _version(text)
        if version is not None:
            attrs[name] = version
    return attrs


def _clique_attrs(inventory: NodeInventory) -> dict[str, dict[str, Any]]:
    """The multi-node NVLink domain (NVL72 rack partition) of the node, none without one: the node
    label nvidia.com/gpu.clique's value, so a claim can match it (constraints: matchAttribute
    gpuweave.io/clique) or select it."""
    fabric = inventory.nvswitch
    if fabric is None or fabric.clique is None:
        return {}
    return {
        "clique": _s(fabric.clique),
        "cliqueID": {"int": fabric.clique_id},
        "clusterUUID": _s(fabric.cluster_uuid),
    }


def _whole_gpu(gpu: Gpu, inventory: NodeInventory, plugin: PluginDevice | None) -> DraDevice:
    attrs = _gpu_attrs(gpu, inventory, DraKind.GPU) | {"uuid": _s(gpu.uuid)}
    domain = nvlink_domains(inventory).get(gpu.index)
    attrs["nvswitch"] = {"bool": bool(inventory.nvswitch and gpu.index in inventory.nvswitch.gpus)}
    attrs["nvlinkPeers"] = {"int": domain[1] if domain else 0}
    if domain:
        attrs["nvlinkDomain"] = _s(domain[0])
    if inventory.nvswitch is not None and gpu.index in inventory.nvswitch.gpus:
        attrs |= _clique_attrs(inventory)
    return DraDevice(
        name=f"gpu-{gpu.index}",
        kind=DraKind.GPU,
        attributes=attrs,
        capacity={"memory": f"{gpu.memory_mib}Mi"},
        plugin=plugin,
        gpu_uuid=gpu.uuid,
    )


def _mig_device(gpu: Gpu, inventory: NodeInventory, mig: MigDevice, plugin: PluginDevice) -> DraDevice:
    attrs = _gpu_attrs(gpu, inventory, DraKind.MIG) | {
        "uuid": _s(mig.uuid),
        "parentUUID": _s(gpu.uuid),
        "profile": _s(mig.profile),
        "placementStart": {"int": mig.placement_start},
        "placementSize": {"int": mig.placement_size},
    }
    return DraDevice(
        name=f"gpu-{gpu.index}-mig-{mig.gpu_instance_id}-{mig.compute_instance_id}",
        kind=DraKind.MIG,
        attributes=attrs,
        capacity={
            "memory": f"{mig.memory_mib}Mi",
            "computeSlices": str(mig.compute_slices),
            "memorySlices": str(mig.placement_size),
        },
        plugin=plugin,
        gpu_uuid=gpu.uuid,
        mig_profile=mig.profile,
        placement_start=mig.placement_start,
    )


def _placement_device(
    gpu: Gpu, inventory: NodeInventory, profile: GiProfile, start: int, existing: MigDevice | None
) -> DraDevice:
    attrs = _gpu_attrs(gpu, inventory, DraKind.MIG) | {
        "parentUUID": _s(gpu.uuid),
        "profile": _s(profile.name),
        "placementStart": {"int": start},
        "placementSize": {"int": profile.memory_slices},
    }
    if existing is not None:
        attrs["uuid"] = _s(existing.uuid)
    consumes = {f"memory-slice-{slot}": 1 for slot in range(start, start + profile.memory_slices)}
    consumes["compute-slices"] = profile.compute_slices
    if profile.name.endswith("+me"):
        consumes["media-extensions"] = 1
    plugin = None
    if existing is not None:
        plugin = PluginDevice(
            id=existing.uuid,
            resource="",
            kind=DeviceKind.MIG,
            numa_node=gpu.numa_node if gpu.numa_node >= 0 else None,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            pcie_switch=gpu.pcie_switch,
        )
    return DraDevice(
        name=f"gpu-{gpu.index}-mig-{dns_part(profile.name)}-{start}",
        kind=DraKind.MIG,
        attributes=attrs,
        capacity={
            "memory": f"{profile.memory_mib}Mi",
            "computeSlices": str(profile.compute_slices),
            "memorySlices": str(profile.memory_slices),
        },
        plugin=plugin,
        gpu_uuid=gpu.uuid,
        consumes=consumes,
        counter_set=counter_set_name(gpu),
        mig_profile=profile.name,
        placement_start=start,
    )


def gpu_counters(gpu: Gpu) -> dict[str, int] | None:
    """The shared counters of a partitionable GPU (None when its model has no MIG catalog entry)."""
    try:
        model = default_catalog().for_product(gpu.product)
    except MigCatalogError:
        return None
    counters = {f"memory-slice-{slot}": 1 for slot in range(model.memory_slices)}
    counters["compute-slices"] = model.compute_slices
    counters["media-extensions"] = 1
    return counters


def _partitionable(gpu: Gpu, inventory: NodeInventory, plugin: PluginDevice | None) -> list[DraDevice]:
    counters = gpu_counters(gpu)
    whole = _whole_gpu(gpu, inventory, plugin if not gpu.mig_enabled else None)
    if counters is None:
        return [whole]
    model = default_catalog().for_product(gpu.product)
    existing = {(m.profile, m.placement_start): m for m in inventory.mig_devices_of(gpu.index)}
    devices = [replace(whole, consumes=dict(counters), counter_set=counter_set_name(gpu))]
    for profile in model.profiles:
        for start in profile.starts:
            devices.append(
                _placement_device(gpu, inventory, profile, start, existing.get((profile.name, start)))
            )
    return devices


def _lost_gpu(lost: LostGpu) -> DraDevice:
    """A GPU off the bus keeps its name in the pool, tainted NoExecute (``taints``): a device that
    just disappeared from a slice would evict nothing, and its claims' pods must go."""
    attrs: dict[str, dict[str, Any]] = {ATTR_TYPE: _s(DraKind.GPU.value), "index": {"int": lost.index}}
    if lost.uuid:
        attrs["uuid"] = _s(lost.uuid)
    return DraDevice(
        name=f"gpu-{lost.index}",
        kind=DraKind.GPU,
        attributes=attrs,
        capacity={},
        plugin=None,
        gpu_uuid=lost.uuid or None,
        lost=True,
    )


def _efa_device(nic: Nic, plugin: PluginDevice) -> DraDevice:
    name = dns_part(nic.name)
    attrs = {
        ATTR_TYPE: _s(DraKind.EFA.value),
        "name": _s(nic.name),
        **_placement_attrs(nic.numa_node, nic.pcie_root, nic.pcie_switch, nic.pci_bus_id),
    }
    return DraDevice(
        name=name if name.startswith("efa") else f"efa-{name}",
        kind=DraKind.EFA,
        attributes=attrs,
        capacity={},
        plugin=plugin,
    )


def _imex_channel(inventory: NodeInventory, plugin: PluginDevice) -> DraDevice:
    """The node's IMEX channel (``nodeagent.devices`` serves the same one as
    ``gpuweave.io/imex-channel``): one device, so the allocator gives it to one claim at a time and
    two jobs on a node never share a channel (the node's IMEX daemon serves one domain)."""
    attrs = {
        ATTR_TYPE: _s(DraKind.IMEX_CHANNEL.value),
        "channel": {"int": plugin.unit},
        **_clique_attrs(inventory),
    }
    return DraDevice(name=plugin.id, kind=DraKind.IMEX_CHANNEL, attributes=attrs, capacity={}, plugin=plugin)


def _kind_device(plugin: PluginDevice) -> DraDevice:
    """A device of a resource kind the extender plans generically (``devicekinds``): published
    under its ID, ``type`` its kind's word; prepared with its kind's grant (``claim_cdi``)."""
    attrs: dict[str, dict[str, Any]] = {ATTR_TYPE: _s(str(plugin.kind)), "id": _s(plugin.id)}
    if plugin.numa_node is not None:
        attrs["numaNode"] = {"int": plugin.numa_node}
    if plugin.pcie_switch:
        attrs["pcieSwitch"] = _s(plugin.pcie_switch)
    name = dns_part(plugin.id)[:63].strip("-") or "device"
    return DraDevice(name=name, kind=DraKind.KIND, attributes=attrs, capacity={}, plugin=plugin)


def dra_devices(
    inventory: NodeInventory, *, mig: MigPublishing = MigPublishing.STATIC
) -> tuple[DraDevice, ...]:
    """Every device of the node's pool, GPUs by index (each followed by its MIG devices), then EFA,
    then the IMEX channel (a node with a clique only), then the devices of every generically
    planned resource kind of the registry (``KindRegistry.planned_generically``)."""
    catalogue = build_catalogue(inventory, SharingPlan())
    plugin_by_id: Mapping[str, PluginDevice] = {d.id: d for ds in catalogue.values() for d in ds}
    devices: list[DraDevice] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if mig is MigPublishing.DYNAMIC and gpu.mig_capable:
            devices += _partitionable(gpu, inventory, plugin_by_id.get(gpu.uuid))
        elif gpu.mig_enabled:
            devices += [
                _mig_device(gpu, inventory, m, plugin_by_id[m.uuid])
                for m in inventory.mig_devices_of(gpu.index)
                if m.uuid in plugin_by_id
            ]
        else:
            devices.append(_whole_gpu(gpu, inventory, plugin_by_id.get(gpu.uuid)))
    present = {d.name for d in devices}
    devices += [_lost_gpu(lost) for lost in inventory.lost_gpus if f"gpu-{lost.index}" not in present]
    for nic in sorted(inventory.nics, key=lambda n: n.name):
        if nic.type is NicType.EFA and nic.name in plugin_by_id:
            devices.append(_efa_device(nic, plugin_by_id[nic.name]))
    devices += [
        _imex_channel(inventory, d)
        for d in catalogue.get(RESOURCE_IMEX_CHANNEL, ())
        if d.kind is DeviceKind.IMEX
    ]
    generic = KINDS.planned_generically()
    for resource, listed in catalogue.items():
        if KINDS.kind_for(resource) in generic:
            devices += [_kind_device(d) for d in listed]
    return tuple(devices)
