"""The extender's decision core, table-driven: fit, reasons, unresolvable, placement, packing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from devicemodel.assignment import device_id_share
from devicemodel.contracts import (
    ANNOTATION_GPU_SELECTOR,
    ANNOTATION_PLACEMENT,
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
)
from devicemodel.inventory import MigDevice, NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode
from gpuweave.simulate.cluster_objects import pod_object, profile_inventory
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.verdict import materialize
from scheduler_ext.pods.requests import BadPodRequestError, pod_request
from topology.fragmentation import TargetWorkload, TaskShape


@pytest.fixture
def core() -> DecisionCore:
    return DecisionCore(LayoutRegistry())


def _state(core: DecisionCore, inventory: NodeInventory, **kwargs: Any) -> NodeState:
    return core.registry.node_state(inventory, name=inventory.name, **kwargs)


def _pod(limits: dict[str, int | str], **annotations: str) -> Any:
    keys = {"selector": ANNOTATION_GPU_SELECTOR, "placement": ANNOTATION_PLACEMENT}
    return pod_request(
        pod_object("p", limits=limits, annotations={keys[k]: v for k, v in annotations.items()})
    )


def _hold(state: NodeState, gpus: list[int], uid: str = "other") -> NodeState:
    assert state.index is not None
    holders = dict(state.holders) | {state.index.gpu_uuids[i]: uid for i in gpus}
    return state.with_holders(holders)


@pytest.mark.parametrize(
    ("profile", "limits", "annotations", "fits", "unresolvable", "reason_part"),
    [
        ("p5.48xlarge", {RESOURCE_GPU: 8}, {}, True, False, ""),
        ("p5.48xlarge", {RESOURCE_GPU: 9}, {}, False, True, "needs 9 whole GPUs; node offers 8"),
        ("dgx1-v100", {RESOURCE_GPU: 8}, {"placement": "nvlink-required"}, False, True, "NVLink"),
        ("dgx1-v100", {RESOURCE_GPU: 4}, {"placement": "nvlink-required"}, True, False, ""),
        ("l40s-pcie-8", {RESOURCE_GPU: 2}, {"placement": "nvlink-required"}, False, True, "largest NVLink"),
        ("p5.48xlarge", {RESOURCE_GPU: 8}, {"placement": "single-numa"}, False, True, "one NUMA node"),
        ("p5.48xlarge", {RESOURCE_GPU: 2}, {"placement": "nic-aligned"}, True, False, ""),
        ("dgx-a100", {RESOURCE_EFA: 1}, {}, False, True, "EFA"),
        (
            "p5.48xlarge",
            {RESOURCE_GPU: 1},
            {"selector": 'device.attributes["gpuweave.io"].architecture == "volta"'},
            False,
            True,
            "matches the gpu-selector",
        ),
        (
            "dgx1-v100",
            {RESOURCE_GPU: 1},
            {"selector": 'device.attributes["gpuweave.io"].architecture == "volta"'},
            True,
            False,
            "",
        ),
        (
            "p5.48xlarge",
            {RESOURCE_GPU: 1},
            {"selector": "device.attributes["},
            False,
            True,
            "does not compile",
        ),
        ("p5.48xlarge", {RESOURCE_GPU_COMPUTE: 30}, {}, False, True, "no fractional GPU"),
    ],
)
def test_fit_table(  # noqa: PLR0917 - pytest passes parameters positionally
    core: DecisionCore,
    profile: str,
    limits: dict[str, int],
    annotations: dict[str, str],
    fits: bool,
    unresolvable: bool,
    reason_part: str,
) -> None:
    state = _state(core, profile_inventory(profile, "n1"))
    verdict = core.decide(_pod(limits, **annotations), state)
    assert (verdict.fits, verdict.unresolvable) == (fits, unresolvable), verdict.reason
    assert reason_part in verdict.reason
    assert 0 <= verdict.score <= 10


def test_busy_gpus_fail_resolvably_with_counts(core: DecisionCore) -> None:
    state = _hold(_state(core, profile_inventory("p5.48xlarge", "n1")), [0, 1, 2, 3, 4, 5])
    verdict = core.decide(_pod({RESOURCE_GPU: 4}), state)
    assert not verdict.fits and not verdict.unresolvable
    assert "needs 4 free GPUs; node has 2 free of 8" in verdict.reason


def test_free_nvlink_group_too_small_is_resolvable(core: DecisionCore) -> None:
    state = _hold(_state(core, profile_inventory("dgx1-v100", "n1")), [1, 2, 4, 7])  # leaves 0,3 | 5,6
    verdict = core.decide(_pod({RESOURCE_GPU: 4}, placement="nvlink-required"), state)
    assert not verdict.fits and not verdict.unresolvable
    assert "largest free NVLink group is" in verdict.reason


def test_unhealthy_gpus_are_withheld_and_unresolvable(core: DecisionCore) -> None:
    inventory = profile_inventory("p5.48xlarge", "n1")
    bad = frozenset(g.uuid for g in inventory.gpus[:2])
    state = _state(core, inventory, unhealthy=bad)
    verdict = core.decide(_pod({RESOURCE_GPU: 7}), state)
    assert verdict.unresolvable and "withheld as unhealthy" in verdict.reason
    fitting = core.decide(_pod({RESOURCE_GPU: 6}), state)
    assert fitting.fits
    chosen = {i for plan in fitting.plan for i in plan.gpus}
    assert not chosen & {0, 1}


def test_dgx1_pair_is_nvlinked_and_quad_is_a_full_mesh(core: DecisionCore) -> None:
    state = _state(core, profile_inventory("dgx1-v100", "n1"))
    pair = core.decide(_pod({RESOURCE_GPU: 2}), state).plan[0].gpus
    assert state.layout is not None and state.layout.all_nvlinked(pair)
    quad = core.decide(_pod({RESOURCE_GPU: 4}), state).plan[0].gpus
    assert state.layout.all_nvlinked(quad)


def test_prioritize_prefers_the_node_that_keeps_nvlink_groups_whole(core: DecisionCore) -> None:
    fresh = _state(core, profile_inventory("dgx1-v100", "n1"))
    half = _hold(_state(core, profile_inventory("dgx1-v100", "n2")), [0, 1, 2, 3])
    request = _pod({RESOURCE_GPU: 4})
    assert core.decide(request, half).score > core.decide(request, fresh).score


def test_cel_selectors_on_versions_and_quantities(core: DecisionCore) -> None:
    state = _state(core, profile_inventory("dgx-a100", "n1"))
    cases = {
        'device.attributes["gpuweave.io"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0': True,
        'device.attributes["gpuweave.io"].cudaComputeCapability >= semver("9.0")': False,
        'device.capacity["gpuweave.io"].memory >= quantity("40Gi")': True,
        'device.capacity["gpuweave.io"].memory.compareTo(quantity("100Gi")) >= 0': False,
        'device.attributes["gpuweave.io"].productName.contains("A100")': True,
        'device.attributes["gpuweave.io"].nvswitch': True,
    }
    for expression, expected in cases.items():
        verdict = core.decide(_pod({RESOURCE_GPU: 1}, selector=expression), state)
        assert verdict.fits is expected, (expression, verdict.reason)


def test_selector_compiles_once_and_caches_per_attribute_set(core: DecisionCore) -> None:
    expression = 'device.attributes["gpuweave.io"].architecture == "hopper"'
    states = [_state(core, profile_inventory("p5.48xlarge", name)) for name in ("n1", "n2", "n3")]
    for state in states:
        core.decide(_pod({RESOURCE_GPU: 1}, selector=expression), state)
    assert states[0].layout is not None
    distinct = {g.attributes for g in states[0].layout.gpus}  # one per NUMA node on this machine
    assert core.selectors.stats(expression) == (1, len(distinct))
    assert len(distinct) < 8


def test_bad_quantity_is_rejected_with_container_and_resource() -> None:
    with pytest.raises(BadPodRequestError, match=r"'main'.*nvidia.com/gpu='1.5'"):
        pod_request(pod_object("p", limits={RESOURCE_GPU: "1.5"}))


def test_unknown_placement_lists_valid_values() -> None:
    with pytest.raises(BadPodRequestError, match="best-effort, nvlink-required"):
        pod_request(pod_object("p", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_PLACEMENT: "fast"}))


def test_init_containers_reuse_the_pods_gpus(core: DecisionCore) -> None:
    state = _state(core, profile_inventory("p5.48xlarge", "n1"))
    request = pod_request(pod_object("p", limits={RESOURCE_GPU: 2}, init_limits={RESOURCE_GPU: 4}))
    assert request.pod_gpus() == 4
    verdict = core.decide(request, state)
    by_name = {p.name: p for p in verdict.plan}
    assert set(by_name["main"].gpus) <= set(by_name["init"].gpus)
    assert len(by_name["init"].gpus) == 4


def _sharing(mode: SharingMode, gpus: range, replicas: int = 4) -> dict[str, GpuSharing]:
    return {str(i): GpuSharing(mode, replicas) for i in gpus}


def test_shares_pack_fgd_style_onto_the_partly_used_gpu(core: DecisionCore) -> None:
    inventory = profile_inventory("p5.48xlarge", "n1")
    state = _state(core, inventory, sharing=_sharing(SharingMode.FRACTIONAL, range(2)))
    used = {device_id_share(inventory.gpus[1].uuid, "compute", u): "x" for u in range(50)}
    state = state.with_holders(used)
    verdict = core.decide(_pod({RESOURCE_GPU_COMPUTE: 50, RESOURCE_GPU_MEMORY: 10}), state)
    assert verdict.fits and verdict.plan[0].share_gpu == 1
    assignment = materialize(verdict.plan, state)
    compute = assignment.containers["main"].devices[RESOURCE_GPU_COMPUTE]
    assert len(compute) == 50 and not set(compute) & set(used)


def test_share_larger_than_a_gpu_is_unresolvable(core: DecisionCore) -> None:
    state = _state(
        core, profile_inventory("p5.48xlarge", "n1"), sharing=_sharing(SharingMode.FRACTIONAL, range(8))
    )
    verdict = core.decide(_pod({RESOURCE_GPU_COMPUTE: 150}), state)
    assert verdict.unresolvable and "more than one GPU offers" in verdict.reason


def test_share_gpus_are_not_offered_whole(core: DecisionCore) -> None:
    state = _state(
        core, profile_inventory("p5.48xlarge", "n1"), sharing=_sharing(SharingMode.FRACTIONAL, range(6))
    )
    assert core.decide(_pod({RESOURCE_GPU: 2}), state).fits
    assert core.decide(_pod({RESOURCE_GPU: 3}), state).unresolvable


def test_time_sliced_replicas_best_fit(core: DecisionCore) -> None:
    inventory = profile_inventory("l40s-pcie-8", "n1")
    state = _state(core, inventory, sharing=_sharing(SharingMode.TIME_SLICED, range(2), replicas=4))
    state = state.with_holders({device_id_share(inventory.gpus[0].uuid, "replica", 0): "x"})
    verdict = core.decide(_pod({RESOURCE_GPU_SHARED: 2}), state)
    assert verdict.fits and verdict.plan[0].share_gpu == 0
    assert core.decide(_pod({RESOURCE_GPU_SHARED: 5}), state).unresolvable


def _with_migs(inventory: NodeInventory, layout: dict[int, list[str]]) -> NodeInventory:
    migs = []
    gpus = list(inventory.gpus)
    for gpu_index, profiles in layout.items():
        parent = inventory.gpu(gpu_index)
        gpus[gpu_index] = replace(parent, mig_enabled=True)
        for slot, profile in enumerate(profiles):
            migs.append(
                MigDevice(
                    uuid=f"MIG-{gpu_index}-{slot}-{inventory.name}",
                    parent_uuid=parent.uuid,
                    parent_index=gpu_index,
                    profile=profile,
                    gpu_instance_id=slot + 1,
                    compute_instance_id=0,
                    placement_start=slot,
                    placement_size=1,
                    memory_mib=10240,
                    compute_slices=1,
                )
            )
    return replace(inventory, gpus=tuple(gpus), mig_devices=tuple(migs))


def test_mig_devices_by_profile_pack_onto_the_fuller_gpu(core: DecisionCore) -> None:
    inventory = _with_migs(profile_inventory("dgx-a100", "n1"), {0: ["1g.10gb"] * 7, 1: ["1g.10gb"] * 7})
    state = _state(core, inventory)
    state = state.with_holders({"MIG-1-0-n1": "x"})
    verdict = core.decide(_pod({"nvidia.com/mig-1g.10gb": 2}), state)
    assert verdict.fits
    assert state.layout is not None
    assert {state.layout.migs[p].parent_index for p in verdict.plan[0].migs} == {1}
    assert core.decide(_pod({"nvidia.com/mig-3g.40gb": 1}), state).unresolvable
    assert not core.decide(_pod({RESOURCE_GPU: 7}), state).fits  # MIG GPUs are not whole GPUs


def test_efa_follows_the_gpus_pcie_switches(core: DecisionCore) -> None:
    state = _state(core, profile_inventory("p5.48xlarge", "n1"))
    verdict = core.decide(_pod({RESOURCE_GPU: 2, RESOURCE_EFA: 2}, placement="nic-aligned"), state)
    assert verdict.fits, verdict.reason
    layout = state.layout
    assert layout is not None
    switches = {layout.gpu_by_index[g].pcie_switch for g in verdict.plan[0].gpus}
    assert {layout.nics[p].pcie_switch for p in verdict.plan[0].nics} == switches  # one per GPU switch


def test_memoized_verdicts_are_shared_by_identical_nodes(core: DecisionCore) -> None:
    states = [_state(core, profile_inventory("p5.48xlarge", f"n{i}")) for i in range(20)]
    request = _pod({RESOURCE_GPU: 4})
    verdicts = core.decide_many(request, [s.name for s in states], {s.name: s for s in states})
    assert len({id(v) for v in verdicts}) == 1
    assert core.memo_size() == 1


@pytest.mark.parametrize(("task_milli", "expected_gpu"), [(500, 0), (1000, 1)])
def test_fgd_follows_the_expected_workload(task_milli: int, expected_gpu: int) -> None:
    """GPU 1 is half used. If half-GPU tasks are expected, a 30% share goes to the idle GPU 0 (GPU 1
    keeps room for one); if only whole-GPU tasks are expected, it goes to GPU 1 (GPU 0 stays whole)."""
    workload = TargetWorkload(
        shapes=(TaskShape(cpu_milli=0, gpu_milli=task_milli, gpu_count=1),), probabilities=(1.0,)
    )
    core = DecisionCore(LayoutRegistry(), share_workload=workload)
    inventory = profile_inventory("p5.48xlarge", "n1")
    state = _state(core, inventory, sharing=_sharing(SharingMode.FRACTIONAL, range(2)))
    state = state.with_holders(
        {device_id_share(inventory.gpus[1].uuid, "compute", u): "x" for u in range(50)}
    )
    verdict = core.decide(_pod({RESOURCE_GPU_COMPUTE: 30}), state)
    assert verdict.fits and verdict.plan[0].share_gpu == expected_gpu
