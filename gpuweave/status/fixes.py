"""What an operator changes so a pending share or MIG pod fits: ``--explain``'s specific hints.

A share pod (``gpuweave.io/gpu-compute``/``-memory``: fractional; ``gpuweave.io/gpu-shared``:
time-sliced) fits nowhere while no node offers its GPUs in that mode; the fix is a node's sharing
configuration. ``sharing_fix`` asks the decision core about each candidate node as it would be
with its free whole GPUs in that mode and, for the first that fits, names the node and the
configuration to give it (a named one chosen by the node's ``gpuweave.io/sharing-config`` label).

A MIG pod fits nowhere while no node has idle instances of its profiles; the fix is a MIG layout.
``mig_fix`` finds the first candidate node with a MIG-capable GPU that nothing holds and whose
model can hold every requested instance (``mig.planner.plan_layout`` from its idle instances),
and names that layout as the node annotation that declares it, with ``gpuweave mig plan`` to
preview it and demand mode as the way to let the agents reshape by themselves.
No I/O: the view holds the listed objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from devicemodel.contracts import LABEL_SHARING_CONFIG, MIG_LAYOUT_ANNOTATION
from devicemodel.errors import GpuweaveError
from devicemodel.sharing import GpuSharing, SharingMode
from gpuweave.status.cluster_view import ClusterView
from hardware.mig_catalog import default_catalog
from mig.planner import Instance, plan_layout
from scheduler_ext.cluster.objects import inventory_record
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.verdict import Verdict
from scheduler_ext.pods.requests import PodRequest

MAX_TRIED_NODES = 64  # nodes asked about in their changed form: one decision each


def share_mode(request: PodRequest) -> SharingMode | None:
    """The sharing mode the pod's shares need (None: it asks for no share)."""
    app = [c for c in request.containers if not c.init]
    if any(c.compute or c.memory_gib for c in app):
        return SharingMode.FRACTIONAL
    if any(c.shared for c in app):
        return SharingMode.TIME_SLICED
    return None


def sharing_fix(
    view: ClusterView, request: PodRequest, *, host: tuple[int, int], verdicts: Mapping[str, Verdict]
) -> str:
    """The node that would fit with its free whole GPUs shared, and the configuration to give it."""
    mode = share_mode(request)
    if mode is None:
        return ""
    for name in [n for n, v in verdicts.items() if not v.fits][:MAX_TRIED_NODES]:
        state = view.cache.node(name)
        shared = _with_free_gpus_in(view, state, mode) if state is not None else None
        if shared is None or not view.core.decide(request, shared, name=name, host=host).fits:
            continue
        example = f"{{default: {{mode: {mode.value}}}}}"
        return (
            f"fits node {name} once its free GPUs are offered {mode.value}: give its node agent a "
            f"sharing configuration with mode {mode.value}; with the chart, an entry of "
            f"nodeAgent.sharingConfigs (e.g. shared: {example}), then `kubectl label node {name} "
            f"{LABEL_SHARING_CONFIG}=shared` and restart that node's agent pod "
            "(docs/device-plugin.md, one configuration per kind of node)"
        )
    return ""


def _with_free_gpus_in(view: ClusterView, state: NodeState, mode: SharingMode) -> NodeState | None:
    """The node's state with every free whole GPU offered in ``mode`` (None: nothing to change)."""
    raw = view.inventories.get(state.name)
    if raw is None or state.layout is None or not state.free.free_gpus:
        return None
    try:
        record = inventory_record(raw)
    except GpuweaveError:
        return None
    sharing = dict(record.sharing)
    by_index = {g.index: g.uuid for g in record.inventory.gpus}
    for index in state.free.free_gpus:
        sharing[by_index[index]] = GpuSharing(mode)
    changed = view.cache.registry.node_state(
        record.inventory, name=state.name, sharing=sharing, unhealthy=record.unhealthy, holders=state.holders
    )
    return changed.with_host_free(state.host_free)


def mig_fix(view: ClusterView, request: PodRequest, *, verdicts: Mapping[str, Verdict]) -> str:
    """A MIG layout on a GPU nothing holds that would offer every instance the pod asks for."""
    wanted = _mig_profiles(request)
    if not wanted:
        return ""
    for name in [n for n, v in verdicts.items() if not v.fits][:MAX_TRIED_NODES]:
        state = view.cache.node(name)
        gpu = _gpu_for(view, state, wanted) if state is not None else None
        if gpu is None:
            continue
        layout = json.dumps({"gpus": {str(gpu): wanted}})
        profiles = ",".join(wanted)
        return (
            f"fits node {name} once its GPU {gpu} (nothing runs on it) holds MIG {profiles}: declare "
            f"the layout, `kubectl annotate node {name} --overwrite {MIG_LAYOUT_ANNOTATION}='{layout}'` "
            f"(preview: gpuweave mig plan --simulate <the node's profile> --gpu {gpu} --profiles "
            f"{profiles}); or let node agents reshape for pending pods with nodeAgent.mig.mode=demand "
            "(docs/mig.md)"
        )
    return _unoffered(view, wanted, names=[n for n, v in verdicts.items() if not v.fits])


def _unoffered(view: ClusterView, wanted: Sequence[str], *, names: Sequence[str]) -> str:
    """Which requested profile no candidate node's MIG-capable GPU model has, and what they have."""
    catalog = default_catalog()
    offered: dict[str, tuple[str, ...]] = {}
    for name in names[:MAX_TRIED_NODES]:
        raw = view.inventories.get(name)
        try:
            gpus = inventory_record(raw).inventory.gpus if raw is not None else ()
        except GpuweaveError:
            continue
        for gpu in gpus:
            if gpu.mig_capable and catalog.supports(gpu.product):
                profiles = catalog.for_product(gpu.product).profiles
                offered.setdefault(gpu.product, tuple(p.name for p in profiles))
    missing = sorted({p for p in wanted if not any(p in profiles for profiles in offered.values())})
    if not offered or not missing:
        return ""
    have = "; ".join(f"{product}: {', '.join(profiles)}" for product, profiles in sorted(offered.items()))
    return (
        f"no MIG-capable GPU of these nodes has the profile {', '.join(missing)}: ask for one they "
        f"offer ({have})"
    )


def _mig_profiles(request: PodRequest) -> list[str]:
    profiles: list[str] = []
    for container in request.containers:
        if not container.init:
            for profile, count in container.mig:
                profiles += [profile] * count
    return sorted(profiles)


def _gpu_for(view: ClusterView, state: NodeState, wanted: Sequence[str]) -> int | None:
    """The first MIG-capable GPU of the node nothing holds whose model can hold ``wanted``."""
    raw = view.inventories.get(state.name)
    if raw is None or state.index is None:
        return None
    try:
        inventory = inventory_record(raw).inventory
    except GpuweaveError:
        return None
    held = set(state.holders)
    catalog = default_catalog()
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        migs = inventory.mig_devices_of(gpu.index)
        busy = gpu.uuid in held or any(m.uuid in held for m in migs)
        if not gpu.mig_capable or busy or gpu.uuid in state.unhealthy or not catalog.supports(gpu.product):
            continue
        idle = [Instance(m.profile, m.placement_start, m.placement_size, key=m.uuid) for m in migs]
        try:
            plan_layout(catalog.for_product(gpu.product), idle, wanted)
        except GpuweaveError:
            continue
        return gpu.index
    return None
