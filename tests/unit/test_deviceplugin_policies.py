"""Pure device-plugin policies: catalogue, health fan-out, preference, allocation, handoff, config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
)
from devicemodel.errors import InvalidInputError
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan, load_sharing_plan
from deviceplugin.handoff import HandoffMatcher, PodView
from deviceplugin.preferred import PreferenceRequest, preferred_devices
from deviceplugin.siblings import SiblingGrants
from nodeagent.allocation import grant_for
from nodeagent.devices import DeviceKind, PluginDevice, build_catalogue, unhealthy_reasons
from nodeagent.errors import AllocationRejectedError
from nodeagent.metrics import AgentMetrics
from tests.support.small_inventory import gpu_uuid, small_inventory

MIG = "nvidia.com/mig-3g.40gb"
FRACTIONAL_3 = SharingPlan(per_gpu={"3": GpuSharing(SharingMode.FRACTIONAL)})


def by_id(devices: tuple[PluginDevice, ...]) -> dict[str, PluginDevice]:
    return {d.id: d for d in devices}


def test_catalogue_splits_gpus_by_mode_and_mig() -> None:
    plan = SharingPlan(
        per_gpu={
            gpu_uuid(2): GpuSharing(SharingMode.TIME_SLICED, replicas=3),
            "3": GpuSharing(SharingMode.FRACTIONAL),
        }
    )
    catalogue = build_catalogue(small_inventory(mig_on=(1,)), plan)
    assert [d.id for d in catalogue[RESOURCE_GPU]] == [gpu_uuid(0)]
    assert len(catalogue[MIG]) == 2 and all(d.gpu_uuid == gpu_uuid(1) for d in catalogue[MIG])
    assert [d.id for d in catalogue[RESOURCE_GPU_SHARED]] == [f"{gpu_uuid(2)}::replica-{k}" for k in range(3)]
    assert len(catalogue[RESOURCE_GPU_COMPUTE]) == 100
    assert len(catalogue[RESOURCE_GPU_MEMORY]) == 80  # 81920 MiB = 80 GiB
    assert [d.device_nodes for d in catalogue[RESOURCE_EFA]] == [
        ("/dev/infiniband/uverbs0",),
        ("/dev/infiniband/uverbs1",),
    ]
    assert all(len(d.id) <= 63 for devices in catalogue.values() for d in devices)


def test_gpu_resource_always_present_and_unknown_numa_omitted() -> None:
    inventory = small_inventory(gpus=2)
    inventory = replace(inventory, gpus=tuple(replace(g, numa_node=-1) for g in inventory.gpus))
    catalogue = build_catalogue(inventory, SharingPlan())
    assert all(d.numa_node is None for d in catalogue[RESOURCE_GPU])
    empty = build_catalogue(replace(inventory, gpus=(), nics=()), SharingPlan())
    assert empty == {RESOURCE_GPU: ()}


def test_gpu_fault_fans_out_to_its_shares_and_mig_devices_only() -> None:
    catalogue = build_catalogue(small_inventory(mig_on=(1,)), FRACTIONAL_3)
    everything = [d for devices in catalogue.values() for d in devices]
    reasons = unhealthy_reasons(
        everything, faults={gpu_uuid(1): "Xid 79", gpu_uuid(3): "Xid 48"}, withheld={}
    )
    assert {d.id for d in catalogue[MIG]} <= reasons.keys()
    assert {d.id for d in catalogue[RESOURCE_GPU_COMPUTE]} <= reasons.keys()
    assert gpu_uuid(0) not in reasons and gpu_uuid(2) not in reasons
    one_mig = catalogue[MIG][0].id
    only = unhealthy_reasons(everything, faults={one_mig: "Xid 94"}, withheld={gpu_uuid(0): "suspect"})
    assert only == {one_mig: "Xid 94", gpu_uuid(0): "suspect"}


def prefer(
    resource: str, available: list[str], size: int, must: tuple[str, ...] = (), **kw: object
) -> list[str]:
    catalogue = build_catalogue(small_inventory(mig_on=(1,)), FRACTIONAL_3)
    devices = by_id(catalogue.get(resource, ()))
    request = PreferenceRequest(resource, tuple(available), must, size)
    return preferred_devices(request, devices=devices, **kw)  # type: ignore[arg-type]


def test_preference_honours_must_include_and_rejects_impossible_sizes() -> None:
    gpus = [gpu_uuid(i) for i in (0, 2)]
    assert prefer(RESOURCE_GPU, gpus, 2, must=(gpu_uuid(2),))[0] == gpu_uuid(2)
    with pytest.raises(AllocationRejectedError, match="larger than the 2 available"):
        prefer(RESOURCE_GPU, gpus, 3)
    with pytest.raises(AllocationRejectedError, match="not in the available set"):
        prefer(RESOURCE_GPU, gpus[:1], 1, must=(gpu_uuid(2),))
    with pytest.raises(AllocationRejectedError, match="at least 1"):
        prefer(RESOURCE_GPU, gpus, 0)


def test_preference_drops_unknown_available_ids_instead_of_failing() -> None:
    assert prefer(RESOURCE_GPU, ["GPU-gone", gpu_uuid(0), gpu_uuid(2)], 1) == [gpu_uuid(0)]


def test_gpu_chooser_is_used_and_bad_answers_fall_back() -> None:
    gpus = [gpu_uuid(0), gpu_uuid(2)]
    assert prefer(RESOURCE_GPU, gpus, 1, gpu_chooser=lambda a, s, m: (2,)) == [gpu_uuid(2)]
    assert prefer(RESOURCE_GPU, gpus, 1, gpu_chooser=lambda a, s, m: (7,)) == [gpu_uuid(0)]
    assert prefer(RESOURCE_GPU, gpus, 1, gpu_chooser=lambda a, s, m: None) == [gpu_uuid(0)]


def test_hint_wins_when_it_fits_the_request() -> None:
    gpus = [gpu_uuid(0), gpu_uuid(2)]
    assert prefer(RESOURCE_GPU, gpus, 1, hint=[gpu_uuid(2)]) == [gpu_uuid(2)]
    assert prefer(RESOURCE_GPU, gpus, 1, hint=["GPU-elsewhere"]) == [gpu_uuid(0)]


def test_compute_units_prefer_the_tightest_single_gpu() -> None:
    catalogue = build_catalogue(small_inventory(), SharingPlan(default=GpuSharing(SharingMode.FRACTIONAL)))
    units = [d.id for d in catalogue[RESOURCE_GPU_COMPUTE]]
    free = [u for u in units if not (u.startswith(gpu_uuid(1)) and int(u.rsplit("-", 1)[1]) < 60)]
    request = PreferenceRequest(RESOURCE_GPU_COMPUTE, tuple(free), (), 30)
    chosen = preferred_devices(request, devices=by_id(catalogue[RESOURCE_GPU_COMPUTE]))
    assert len(chosen) == 30 and {c.split("::")[0] for c in chosen} == {gpu_uuid(1)}
    too_big = PreferenceRequest(RESOURCE_GPU_COMPUTE, tuple(free), (), 101)
    assert preferred_devices(too_big, devices=by_id(catalogue[RESOURCE_GPU_COMPUTE])) == []


def test_replicas_take_the_tightest_gpu_and_mig_packs() -> None:
    """Time-sliced replicas follow the extender's rule: one GPU, the one left with least room."""
    plan = SharingPlan(default=GpuSharing(SharingMode.TIME_SLICED, replicas=2))
    catalogue = build_catalogue(small_inventory(), plan)
    replicas = by_id(catalogue[RESOURCE_GPU_SHARED])
    taken = next(c for c in replicas if replicas[c].gpu_index == 1)  # GPU 1 has one replica left
    free = tuple(c for c in replicas if c != taken)
    one = preferred_devices(PreferenceRequest(RESOURCE_GPU_SHARED, free, (), 1), devices=replicas)
    two = preferred_devices(PreferenceRequest(RESOURCE_GPU_SHARED, free, (), 2), devices=replicas)
    assert [replicas[c].gpu_index for c in one] == [1]
    assert [replicas[c].gpu_index for c in two] == [0, 0]
    too_many = PreferenceRequest(RESOURCE_GPU_SHARED, free, (), 3)
    assert preferred_devices(too_many, devices=replicas) == []  # one GPU offers two
    migs = build_catalogue(small_inventory(mig_on=(1, 2)), SharingPlan())[MIG]
    busy_first = [migs[0].id, migs[2].id, migs[3].id]  # GPU 1 has one MIG device left, GPU 2 two
    chosen = preferred_devices(PreferenceRequest(MIG, tuple(busy_first), (), 1), devices=by_id(migs))
    assert chosen == [migs[0].id]


def grant(resource: str, ids: list[str], unhealthy: dict[str, str] | None = None) -> dict[str, str]:
    catalogue = build_catalogue(small_inventory(), FRACTIONAL_3)
    result = grant_for(
        resource, ids, devices=by_id(catalogue[resource]), unhealthy=unhealthy or {}, mps_pipe_dir="/run/mps"
    )
    return dict(result.envs)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([], "empty allocation request"),
        (["GPU-x"], "unknown device 'GPU-x'"),
        ([gpu_uuid(0), gpu_uuid(0)], "requested twice"),
    ],
)
def test_allocate_rejects_bad_requests_with_reasons(ids: list[str], message: str) -> None:
    with pytest.raises(AllocationRejectedError, match=message):
        grant(RESOURCE_GPU, ids)


def test_allocate_rejects_unhealthy_and_cross_gpu_shares() -> None:
    with pytest.raises(AllocationRejectedError, match="unhealthy"):
        grant(RESOURCE_GPU, [gpu_uuid(0)], {gpu_uuid(0): "Xid 79"})
    plan = SharingPlan(default=GpuSharing(SharingMode.FRACTIONAL))
    devices = by_id(build_catalogue(small_inventory(), plan)[RESOURCE_GPU_COMPUTE])
    spread = [f"{gpu_uuid(0)}::compute-0", f"{gpu_uuid(1)}::compute-0"]
    with pytest.raises(AllocationRejectedError, match="span 2 GPUs"):
        grant_for(RESOURCE_GPU_COMPUTE, spread, devices=devices, unhealthy={})


def test_share_grants_set_mps_limits() -> None:
    compute = grant(RESOURCE_GPU_COMPUTE, [f"{gpu_uuid(3)}::compute-{k}" for k in range(25)])
    assert compute["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(3)
    assert compute["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert compute["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"
    memory = grant(RESOURCE_GPU_MEMORY, [f"{gpu_uuid(3)}::memory-{k}" for k in range(4)])
    assert memory["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"


def test_efa_device_without_uverbs_is_rejected_alone() -> None:
    device = PluginDevice("efa_x", RESOURCE_EFA, DeviceKind.EFA, 0)
    with pytest.raises(AllocationRejectedError, match="no uverbs"):
        grant_for(RESOURCE_EFA, ["efa_x"], devices={"efa_x": device}, unhealthy={})


def pending(view: PodView, uid: str, ids: list[str], *, node: str = "node-a", bound: str = "") -> None:
    assignment = PodAssignment(
        node=node, containers={"main": ContainerAssignment(devices={RESOURCE_GPU: ids})}
    )
    view.upsert(
        uid=uid,
        namespace="ml",
        name=uid,
        phase="Pending",
        annotation=assignment.to_annotation(),
        resource_version=bound,
    )


def test_handoff_follows_a_unique_assignment_once() -> None:
    view, metrics = PodView(), AgentMetrics()
    reports: list[str] = []
    matcher = HandoffMatcher(view, node="node-a", metrics=metrics, report=lambda p, r, m: reports.append(m))
    pending(view, "p1", [gpu_uuid(2), gpu_uuid(3)])
    request = PreferenceRequest(RESOURCE_GPU, tuple(gpu_uuid(i) for i in range(4)), (), 2)
    assert matcher.hint(request, {}) == [gpu_uuid(2), gpu_uuid(3)]
    matcher.observe_allocation(RESOURCE_GPU, [gpu_uuid(2), gpu_uuid(3)])
    assert matcher.hint(request, {}) is None  # already served
    assert (
        metrics.registry.get_sample_value(
            "gpuweave_deviceplugin_handoff_total", {"resource": RESOURCE_GPU, "outcome": "followed"}
        )
        == 1
    )
    assert reports == []


def test_handoff_burst_follows_admission_order_and_mismatches_are_reported() -> None:
    view, metrics = PodView(), AgentMetrics()
    reports: list[str] = []
    matcher = HandoffMatcher(view, node="node-a", metrics=metrics, report=lambda p, r, m: reports.append(r))
    pending(view, "p-late", [gpu_uuid(1)], bound="120")  # seen first (after a re-list), bound last
    pending(view, "p-early", [gpu_uuid(0)], bound="101")
    pending(view, "p-early-2", [gpu_uuid(2)], bound="105")
    request = PreferenceRequest(RESOURCE_GPU, tuple(gpu_uuid(i) for i in range(4)), (), 1)
    assert matcher.hint(request, {}) == [gpu_uuid(0)]  # bound first
    assert matcher.hint(request, {}) == [gpu_uuid(2)]  # bound second
    matcher.observe_allocation(RESOURCE_GPU, [gpu_uuid(3)])  # the kubelet took another device
    assert matcher.hint(request, {}) == [gpu_uuid(1)]
    for gone in ("p-late", "p-early", "p-early-2"):
        view.remove(gone)
    pending(view, "p3", [gpu_uuid(9)])
    assert matcher.hint(request, {}) is None
    sample = metrics.registry.get_sample_value
    labels = {"resource": RESOURCE_GPU}
    assert sample("gpuweave_deviceplugin_handoff_total", {**labels, "outcome": "followed_earliest"}) == 2
    assert sample("gpuweave_deviceplugin_handoff_total", {**labels, "outcome": "followed"}) == 1
    assert sample("gpuweave_deviceplugin_handoff_total", {**labels, "outcome": "mismatch"}) == 2
    assert reports == ["GpuAssignmentMismatch", "GpuAssignmentMismatch"]


def test_pod_view_keeps_arrival_order_across_a_relist() -> None:
    view = PodView()
    pending(view, "a", [gpu_uuid(0)])
    pending(view, "b", [gpu_uuid(1)])
    # a relist listing c, b arrives as kubeio.listwatch hands it on: DELETED a, ADDED c, MODIFIED b
    view.remove("a")
    pending(view, "c", [gpu_uuid(2)])
    pending(view, "b", [gpu_uuid(1)])
    order = sorted(view.pending(), key=lambda p: p.seen)
    assert [p.uid for p in order] == ["b", "c"]


def test_handoff_of_shares_keeps_the_gpu_when_unit_numbers_differ() -> None:
    view = PodView()
    matcher = HandoffMatcher(view, node="node-a", metrics=AgentMetrics())
    assigned = [f"{gpu_uuid(1)}::compute-{k}" for k in range(3)]
    assignment = PodAssignment(
        node="node-a", containers={"main": ContainerAssignment(devices={RESOURCE_GPU_COMPUTE: assigned})}
    )
    view.upsert(uid="p1", namespace="ml", name="p1", phase="Pending", annotation=assignment.to_annotation())
    offered = tuple(f"{gpu_uuid(g)}::compute-{k}" for g in (0, 1) for k in range(2, 10))
    hint = matcher.hint(PreferenceRequest(RESOURCE_GPU_COMPUTE, offered, (), 3), {})
    assert hint is not None and len(hint) == 3
    assert {h.split("::")[0] for h in hint} == {gpu_uuid(1)}
    assert f"{gpu_uuid(1)}::compute-2" in hint  # an assigned unit that is free is kept


def test_handoff_ignores_other_nodes_and_running_pods() -> None:
    view = PodView()
    matcher = HandoffMatcher(view, node="node-a", metrics=AgentMetrics())
    pending(view, "p1", [gpu_uuid(0)], node="node-b")
    view.upsert(uid="p2", namespace="ml", name="p2", phase="Running", annotation="{}")
    request = PreferenceRequest(RESOURCE_GPU, (gpu_uuid(0),), (), 1)
    assert matcher.hint(request, {}) is None


def test_sharing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "sharing.yaml"
    path.write_text(
        "apiVersion: gpuweave.io/v1alpha1\nkind: SharingConfig\n"
        "gpus:\n  '0': {mode: fractional}\n  GPU-abc: {mode: time-sliced, replicas: 8}\n"
        "mpsPipeDirectory: /run/nvidia/mps\n"
    )
    plan = load_sharing_plan(path)
    assert plan.per_gpu["0"].mode is SharingMode.FRACTIONAL
    assert plan.per_gpu["GPU-abc"].replicas == 8
    assert plan.mps_pipe_directory == "/run/nvidia/mps"
    path.write_text("gpus:\n  '0': {mode: halves}\n")
    with pytest.raises(InvalidInputError, match=r"gpus\.0\.mode"):
        load_sharing_plan(path)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sibling_grants_are_used_once_within_the_window() -> None:
    clock = FakeClock()
    siblings = SiblingGrants(window=5.0, clock=clock)
    plan = SharingPlan(default=GpuSharing(SharingMode.FRACTIONAL))
    catalogue = build_catalogue(small_inventory(), plan)
    compute = catalogue[RESOURCE_GPU_COMPUTE][:3]
    siblings.remember(RESOURCE_GPU_COMPUTE, compute)
    assert siblings.near(RESOURCE_GPU_COMPUTE) == ()  # only the sibling resource benefits
    assert siblings.near(RESOURCE_GPU_MEMORY) == compute
    assert siblings.near(RESOURCE_GPU_MEMORY) == ()  # used once
    siblings.remember(RESOURCE_GPU_MEMORY, catalogue[RESOURCE_GPU_MEMORY][:1])
    clock.now += 6
    assert siblings.near(RESOURCE_GPU_COMPUTE) == ()  # too old: another container's
    siblings.remember(RESOURCE_EFA, catalogue[RESOURCE_EFA][:1])  # nothing follows EFA
    assert siblings.near(RESOURCE_GPU) == ()


def test_efa_prefers_adapters_beside_the_containers_gpus() -> None:
    catalogue = build_catalogue(small_inventory(), SharingPlan())
    nics = by_id(catalogue[RESOURCE_EFA])
    request = PreferenceRequest(RESOURCE_EFA, tuple(nics), (), 1)
    gpu3 = by_id(catalogue[RESOURCE_GPU])[gpu_uuid(3)]  # NUMA 1, switch sw1
    assert preferred_devices(request, devices=nics, near=(gpu3,)) == ["rdmap17s0"]
    gpu0 = by_id(catalogue[RESOURCE_GPU])[gpu_uuid(0)]
    assert preferred_devices(request, devices=nics, near=(gpu0,)) == ["rdmap16s0"]


def test_affine_gpu_beats_tightest_fit_only_when_it_fits() -> None:
    plan = SharingPlan(default=GpuSharing(SharingMode.FRACTIONAL))
    memory = by_id(build_catalogue(small_inventory(gpus=2), plan)[RESOURCE_GPU_MEMORY])
    free = tuple(m for m in memory if not (m.startswith(gpu_uuid(0)) and int(m.rsplit("-", 1)[1]) < 70))
    request = PreferenceRequest(RESOURCE_GPU_MEMORY, free, (), 8)
    tightest = preferred_devices(request, devices=memory)
    assert {memory[i].gpu_uuid for i in tightest} == {gpu_uuid(0)}  # 10 GiB left there: the tightest
    near_gpu1 = (next(d for d in memory.values() if d.gpu_uuid == gpu_uuid(1)),)
    affine = preferred_devices(request, devices=memory, near=near_gpu1)
    assert {memory[i].gpu_uuid for i in affine} == {gpu_uuid(1)}
    big = PreferenceRequest(RESOURCE_GPU_MEMORY, free, (), 20)
    near_gpu0 = (next(d for d in memory.values() if d.gpu_uuid == gpu_uuid(0)),)
    assert {memory[i].gpu_uuid for i in preferred_devices(big, devices=memory, near=near_gpu0)} == {
        gpu_uuid(1)
    }
