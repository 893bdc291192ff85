"""Cross-field checks of a node profile spec: the rules one field alone cannot state.

Each check returns the first problem as ``"<field path>: <what is wrong>"`` (path relative to
``spec``), or None. The spec model turns that into a one-line ``ProfileError``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from devicemodel.inventory import Architecture, NicType
from devicemodel.spec_derive import MAX_GPUS, MAX_NICS, gpu_bus_id, nic_bus_ids, switch_roots

if TYPE_CHECKING:
    from devicemodel.spec import GpuSpec, NicSpec, NodeProfileSpec

# NVLink lanes per GPU by family (NVML_NVLINK_MAX_LINKS is 18).
MAX_NVLINKS = {
    Architecture.PASCAL: 4,
    Architecture.VOLTA: 6,
    Architecture.TURING: 2,
    Architecture.AMPERE: 12,
    Architecture.HOPPER: 18,
    Architecture.BLACKWELL: 18,
}
NVML_NVLINK_MAX_LINKS = 18


def check_spec(spec: NodeProfileSpec) -> str | None:
    checks: tuple[Callable[[NodeProfileSpec], str | None], ...] = (
        _check_switches, _check_gpus, _check_gpu_placement, _check_nvlinks, _check_nvswitch,
        _check_link_budget, _check_nics, _check_bus_ids, _check_mig_devices,
    )
    for check in checks:
        problem = check(spec)
        if problem is not None:
            return problem
    return None


def _duplicate(values: Iterable[object]) -> object | None:
    counts = Counter(values)
    return next((value for value, count in counts.items() if count > 1), None)


def _numa_problem(where: str, numa_node: int, spec: NodeProfileSpec) -> str | None:
    if numa_node >= spec.numa_nodes:
        return f"{where}.numaNode: NUMA node {numa_node} out of range (numaNodes is {spec.numa_nodes})"
    return None


def _check_switches(spec: NodeProfileSpec) -> str | None:
    for i, sw in enumerate(spec.pcie_switches):
        if [s.name for s in spec.pcie_switches].index(sw.name) != i:
            return f"pcieSwitches[{i}].name: duplicate PCIe switch name {sw.name!r}"
        problem = _numa_problem(f"pcieSwitches[{i}]", sw.numa_node, spec)
        if problem:
            return problem
    used = {g.pcie_switch for g in spec.gpus} | {n.pcie_switch for n in spec.nics}
    for i, sw in enumerate(spec.pcie_switches):
        if sw.name not in used:
            return (
                f"pcieSwitches[{i}]: no GPU or NIC sits on PCIe switch {sw.name!r}, so discovery "
                "would never see it; remove it or place a device on it"
            )
    return None


def _check_gpus(spec: NodeProfileSpec) -> str | None:
    if len(spec.gpus) > MAX_GPUS:
        return f"gpus: {len(spec.gpus)} GPUs, at most {MAX_GPUS} per node are supported"
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    for i, gpu in enumerate(spec.gpus):
        if gpu.index in seen_index:
            return f"gpus[{i}].index: duplicate GPU index {gpu.index}"
        if gpu.uuid is not None and gpu.uuid in seen_uuid:
            return f"gpus[{i}].uuid: duplicate GPU UUID {gpu.uuid}"
        seen_index.add(gpu.index)
        seen_uuid.add(gpu.uuid or "")
        if gpu.mig_enabled and not gpu.mig_capable:
            return f"gpus[{i}].migEnabled: GPU {gpu.index} ({gpu.product}) is not migCapable"
    minor = _duplicate(g.minor for g in spec.gpus if g.minor is not None)
    if minor is not None:
        return f"gpus: duplicate minor number {minor}"
    return None


def _placement_problem(where: str, item: GpuSpec | NicSpec, spec: NodeProfileSpec) -> str | None:
    problem = _numa_problem(where, item.numa_node, spec)
    if problem or item.pcie_switch is None:
        return problem
    switches = {s.name: s for s in spec.pcie_switches}
    switch = switches.get(item.pcie_switch)
    if switch is None:
        known = ", ".join(switches) or "none"
        return f"{where}.pcieSwitch: unknown PCIe switch {item.pcie_switch!r} (known: {known})"
    if switch.numa_node != item.numa_node:
        return (
            f"{where}.numaNode: {item.numa_node}, but its PCIe switch {switch.name} is on "
            f"NUMA node {switch.numa_node}"
        )
    root = switch_roots(spec)[switch.name]
    if item.pcie_root is not None and item.pcie_root != root:
        return f"{where}.pcieRoot: {item.pcie_root!r}, but its PCIe switch {switch.name} is under {root!r}"
    return None


def _check_gpu_placement(spec: NodeProfileSpec) -> str | None:
    for i, gpu in enumerate(spec.gpus):
        problem = _placement_problem(f"gpus[{i}]", gpu, spec)
        if problem:
            return problem
    return None


def _check_nvlinks(spec: NodeProfileSpec) -> str | None:
    indexes = {g.index for g in spec.gpus}
    pairs: set[tuple[int, int]] = set()
    for i, link in enumerate(spec.nvlinks):
        a, b = link.gpus
        for gpu in (a, b):
            if gpu not in indexes:
                return f"nvlinks[{i}].gpus: no GPU with index {gpu} (node has {len(indexes)} GPUs)"
        if a == b:
            return f"nvlinks[{i}].gpus: GPU {a} cannot link to itself"
        pair = (min(a, b), max(a, b))
        if pair in pairs:
            return f"nvlinks[{i}].gpus: GPUs {a} and {b} are listed twice; give one entry with the link count"
        pairs.add(pair)
    return None


def _check_nvswitch(spec: NodeProfileSpec) -> str | None:
    if spec.nvswitch is None:
        return None
    indexes = {g.index for g in spec.gpus}
    for gpu in spec.nvswitch.gpus:
        if gpu not in indexes:
            return f"nvswitch.gpus: no GPU with index {gpu} (node has {len(indexes)} GPUs)"
    duplicate = _duplicate(spec.nvswitch.gpus)
    if duplicate is not None:
        return f"nvswitch.gpus: GPU {duplicate} listed twice"
    return None


def _check_link_budget(spec: NodeProfileSpec) -> str | None:
    lanes: Counter[int] = Counter()
    for link in spec.nvlinks:
        lanes[link.gpus[0]] += link.links
        lanes[link.gpus[1]] += link.links
    if spec.nvswitch is not None:
        for member in spec.nvswitch.gpus:
            lanes[member] += spec.nvswitch.links_per_gpu
    for i, gpu in enumerate(spec.gpus):
        limit = MAX_NVLINKS.get(gpu.architecture, NVML_NVLINK_MAX_LINKS)
        if lanes[gpu.index] > limit:
            return (
                f"gpus[{i}]: GPU {gpu.index} has {lanes[gpu.index]} NVLink lanes in nvlinks/nvswitch, "
                f"but a {gpu.architecture.value} GPU has at most {limit}"
            )
    return None


def _check_nics(spec: NodeProfileSpec) -> str | None:
    if len(spec.nics) > MAX_NICS:
        return f"nics: {len(spec.nics)} NICs, at most {MAX_NICS} per node are supported"
    names: set[str] = set()
    uverbs: set[str] = set()
    for i, nic in enumerate(spec.nics):
        if nic.name in names:
            return f"nics[{i}].name: duplicate NIC name {nic.name!r}"
        names.add(nic.name)
        if nic.type is NicType.ETHERNET and not nic.uverbs and nic.netdev and nic.netdev != nic.name:
            return (
                f"nics[{i}].netdev: {nic.netdev!r}, but a NIC without RDMA is named by its interface; "
                f"name it {nic.netdev!r} or omit netdev"
            )
        if nic.uverbs:
            if nic.uverbs in uverbs:
                return f"nics[{i}].uverbs: {nic.uverbs} is already used by another NIC"
            uverbs.add(nic.uverbs)
        problem = _placement_problem(f"nics[{i}]", nic, spec)
        if problem:
            return problem
    return None


def _check_bus_ids(spec: NodeProfileSpec) -> str | None:
    owners: dict[str, str] = {}
    nic_ids = nic_bus_ids(spec)
    items = [(f"gpus[{i}]", gpu_bus_id(g)) for i, g in enumerate(spec.gpus)]
    items += [(f"nics[{i}]", nic_ids[n.name]) for i, n in enumerate(spec.nics)]
    for where, bus_id in items:
        if bus_id in owners:
            return f"{where}.pciBusId: {bus_id} is already used by {owners[bus_id]}"
        owners[bus_id] = where
    return None


def _check_mig_devices(spec: NodeProfileSpec) -> str | None:
    gpus = {g.index: g for g in spec.gpus}
    instances: dict[tuple[int, int], tuple[int, int]] = {}
    seen: set[tuple[int, int, int]] = set()
    uuids: set[str] = set()
    for i, mig in enumerate(spec.mig_devices):
        where = f"migDevices[{i}]"
        gpu = gpus.get(mig.gpu)
        if gpu is None or not gpu.mig_enabled:
            return f"{where}.gpu: GPU {mig.gpu} does not exist or does not have migEnabled: true"
        key = (mig.gpu, mig.gpu_instance_id, mig.compute_instance_id)
        if key in seen:
            return f"{where}: GPU {mig.gpu} lists GPU instance {key[1]} compute instance {key[2]} twice"
        seen.add(key)
        if mig.uuid is not None:
            if mig.uuid in uuids:
                return f"{where}.uuid: duplicate MIG UUID {mig.uuid}"
            uuids.add(mig.uuid)
        problem = _placement_overlap(where, mig.gpu, mig.gpu_instance_id,
                                     (mig.placement_start, mig.placement_size), instances)
        if problem:
            return problem
    return None


def _placement_overlap(
    where: str, gpu: int, instance: int, placement: tuple[int, int],
    instances: dict[tuple[int, int], tuple[int, int]],
) -> str | None:
    """Compute instances of one GPU instance share its placement; GPU instances never overlap."""
    known = instances.setdefault((gpu, instance), placement)
    if known != placement:
        return f"{where}.placementStart: GPU instance {instance} on GPU {gpu} has placement {known} elsewhere"
    start, size = placement
    for (other_gpu, other_instance), (other_start, other_size) in instances.items():
        if other_gpu == gpu and other_instance != instance and start < other_start + other_size \
                and other_start < start + size:
            return (
                f"{where}.placementStart: slots {start}..{start + size - 1} on GPU {gpu} overlap "
                f"GPU instance {other_instance} at {other_start}..{other_start + other_size - 1}"
            )
    return None


def index_gap_problem(indexes: list[int]) -> str | None:
    """A profile lists every GPU, so its indexes are NVML's ``0..n-1``. A discovered inventory may
    have gaps (GPUs the driver counts but cannot reach), so this is checked for profiles only;
    duplicates are left to ``check_spec``, which names the entry."""
    if len(set(indexes)) != len(indexes):
        return None
    missing = sorted(set(range(len(indexes))) - set(indexes))
    if not missing:
        return None
    return (
        f"spec.gpus: indexes must be 0..{len(indexes) - 1} as NVML numbers them; "
        f"missing {', '.join(map(str, missing))}"
    )
