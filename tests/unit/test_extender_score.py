"""Node scores across hardware classes: multi-GPU sets weigh absolute quality, single GPUs pack."""

from __future__ import annotations

import pytest

from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from devicemodel.sharing import GpuSharing, SharingMode
from gpuweave.simulate.cluster_objects import pod_object, profile_inventory
from hardware.profiles import builtin_profile_names
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.search import absolute_quality
from scheduler_ext.decide.state import NodeState
from scheduler_ext.pods.requests import PodRequest, pod_request
from topology.graph import TopologyGraph
from topology.scoring import score_set


@pytest.fixture
def core() -> DecisionCore:
    return DecisionCore(LayoutRegistry())


def _state(core: DecisionCore, profile: str, name: str) -> NodeState:
    return core.registry.node_state(profile_inventory(profile, name), name=name)


def _gpus(count: int) -> PodRequest:
    return pod_request(pod_object("p", limits={RESOURCE_GPU: count}))


def _hold(state: NodeState, gpus: list[int]) -> NodeState:
    assert state.index is not None
    return state.with_holders(dict(state.holders) | {state.index.gpu_uuids[i]: "other" for i in gpus})


@pytest.mark.parametrize("count", [2, 4])
def test_nvlink_node_beats_pcie_only_node_for_a_multi_gpu_best_effort_pod(
    core: DecisionCore, count: int
) -> None:
    dgx1 = core.decide(_gpus(count), _state(core, "dgx1-v100", "dgx1"))
    l40s = core.decide(_gpus(count), _state(core, "l40s-pcie-8", "l40s"))
    assert dgx1.fits and l40s.fits
    assert dgx1.score > l40s.score


def test_nvswitch_node_beats_nvlink_cube_mesh_for_four_gpus(core: DecisionCore) -> None:
    h100 = core.decide(_gpus(4), _state(core, "dgx-h100", "h100"))
    dgx1 = core.decide(_gpus(4), _state(core, "dgx1-v100", "dgx1"))
    assert h100.score > dgx1.score


def test_single_gpu_pod_does_not_prefer_the_empty_nvlink_node(core: DecisionCore) -> None:
    dgx1 = core.decide(_gpus(1), _state(core, "dgx1-v100", "dgx1"))
    l40s = core.decide(_gpus(1), _state(core, "l40s-pcie-8", "l40s"))
    assert l40s.score > dgx1.score  # the NVLink-peer penalty: DGX-1 stays whole for gangs


def test_single_gpu_pod_still_fills_the_last_gpu_of_an_nvlink_node(core: DecisionCore) -> None:
    """A GPU whose NVLink peers are all busy costs no gang anything: packing decides."""
    nearly_full = _hold(_state(core, "dgx1-v100", "dgx1"), [0, 1, 2, 3, 4, 5, 6])
    l40s = core.decide(_gpus(1), _state(core, "l40s-pcie-8", "l40s"))
    assert core.decide(_gpus(1), nearly_full).score > l40s.score


def test_fractional_pods_keep_fgd_scores_on_any_hardware(core: DecisionCore) -> None:
    request = pod_request(pod_object("p", limits={RESOURCE_GPU_COMPUTE: 30}))
    fractional = {"0": GpuSharing(SharingMode.FRACTIONAL)}
    scores = set()
    for profile in ("dgx1-v100", "l40s-pcie-8"):
        inventory = profile_inventory(profile, profile)
        state = core.registry.node_state(inventory, name=profile, sharing=fractional)
        verdict = core.decide(request, state)
        assert verdict.fits
        scores.add(verdict.score)
    assert len(scores) == 1


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_scores_stay_within_zero_to_ten(core: DecisionCore, profile: str) -> None:
    state = _state(core, profile, profile)
    for count in (1, 2, 3, 4, 8):
        verdict = core.decide(_gpus(count), state)
        assert 0 <= verdict.score <= 10


def test_absolute_quality_orders_hardware_classes() -> None:
    def quality(profile: str, gpus: tuple[int, ...]) -> float:
        graph = TopologyGraph.from_inventory(profile_inventory(profile, "n"))
        return absolute_quality(score_set(graph, gpus))

    quad = (0, 1, 2, 3)
    h100, dgx1, l40s = quality("dgx-h100", quad), quality("dgx1-v100", quad), quality("l40s-pcie-8", quad)
    assert 1.0 >= h100 > dgx1 > l40s >= 0.0


def test_a_single_gpu_fills_the_node_that_lost_a_gpu_before_an_intact_one(core: DecisionCore) -> None:
    """Two p4d nodes with 6 GPUs free each: one has 2 busy, the other 1 busy and 1 withheld as
    unhealthy. Packing counts what is left against the GPUs the node was built with, so both
    look equally full; the withheld GPU does not make its node look emptier (it cannot take an
    8-GPU pod either way, and leaving it half idle would fragment the intact one)."""
    intact = _hold(_state(core, "p4d.24xlarge", "intact"), [0, 1])
    inventory = profile_inventory("p4d.24xlarge", "broken")
    broken = _hold(
        core.registry.node_state(inventory, name="broken", unhealthy=frozenset({inventory.gpus[1].uuid})), [0]
    )
    assert len(intact.free.free_gpus) == len(broken.free.free_gpus) == 6
    assert core.decide(_gpus(1), broken).score >= core.decide(_gpus(1), intact).score
    assert core.decide(_gpus(1), broken).quality == pytest.approx(core.decide(_gpus(1), intact).quality)
