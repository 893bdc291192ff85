"""The capacity controller's pure core: packing pending demand onto whole machines, bounded, and
reading only the demand that fits no node now but would fit a new machine of a pool."""

from __future__ import annotations

from typing import Any

from devicemodel.contracts import NODE_INVENTORY_KIND
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.lifecycle.capacity import (
    KIND_GANG,
    KIND_MIG,
    KIND_SHARES,
    GangDemand,
    MigDemand,
    PoolOffer,
    ShareDemand,
    buffer_name,
    mig_gpus,
    plan_buffers,
    share_gpus,
)
from gpuweave.lifecycle.capacity_config import CapacityConfig, PoolModel, offer_of
from gpuweave.lifecycle.demand import LABEL_NODEPOOL, NewMachines, read_demand, shares_stuck
from gpuweave.status.cluster_view import ClusterView
from hardware.profiles import load_profile
from nodeagent.published import inventory_object

SHARES = PoolOffer("shares", "p5.48xlarge", gpus=8, memory_gib=80, offers="fractional")
MIG = PoolOffer(
    "mig", "p5.48xlarge", gpus=8, memory_gib=80, offers="mig", mig_max={"3g.40gb": 2, "1g.10gb": 7}
)
GANG = PoolOffer("gang", "p5.48xlarge", gpus=8, memory_gib=80, offers="exclusive")
POOLS = {p.name: p for p in (SHARES, MIG, GANG)}


def _share(pod: str, compute: int, memory: int = 0) -> ShareDemand:
    return ShareDemand(pod, compute, memory, 0, ("shares",))


def test_shares_are_packed_onto_whole_gpus_largest_first() -> None:
    ten = [_share(f"ns/p{i}", 30) for i in range(10)]
    assert share_gpus(ten, SHARES) == 4  # three 30s per GPU: 3 + 3 + 3 + 1
    mixed = [_share("ns/a", 70), _share("ns/b", 30), _share("ns/c", 60), _share("ns/d", 40)]
    assert share_gpus(mixed, SHARES) == 2  # 70 + 30, 60 + 40
    by_memory = [_share(f"ns/m{i}", 10, memory=50) for i in range(3)]
    assert share_gpus(by_memory, SHARES) == 3  # 80 GiB per GPU holds one 50 GiB share


def test_time_sliced_replicas_fill_a_gpu_each() -> None:
    sliced = PoolOffer("ts", "p5.48xlarge", gpus=8, memory_gib=80, offers="time-sliced", replicas=4)
    demands = [ShareDemand(f"ns/t{i}", 0, 0, 1, ("ts",)) for i in range(9)]
    assert share_gpus(demands, sliced) == 3


def test_mig_profiles_count_their_share_of_a_gpu() -> None:
    demands = [MigDemand(f"ns/m{i}", {"3g.40gb": 1}, ("mig",)) for i in range(3)]
    assert mig_gpus(demands, MIG) == 2
    assert mig_gpus([MigDemand("ns/x", {"1g.10gb": 7}, ("mig",))], MIG) == 1


def test_ten_shares_ask_for_one_machine_not_ten() -> None:
    plans = plan_buffers(
        shares=[_share(f"ns/p{i}", 30) for i in range(10)], migs=[], gangs=[], pools=POOLS, max_nodes=8
    )
    (plan,) = plans
    assert (plan.kind, plan.pool, plan.nodes, plan.name) == (
        KIND_SHARES,
        "shares",
        1,
        "gpuweave-shares-shares",
    )
    assert len(plan.pods) == 10


def test_a_gang_gets_whole_machines_in_its_tier_first_and_the_cap_holds() -> None:
    gang = GangDemand(
        "ns/train", ("ns/train-0", "ns/train-1"), 2, 8, "topology.k8s.aws/network-node-layer-3", ("gang",)
    )
    shares = [_share(f"ns/p{i}", 100) for i in range(40)]  # 40 GPUs: five machines
    plans = plan_buffers(shares=shares, migs=[], gangs=[gang], pools=POOLS, max_nodes=4)
    assert [(p.kind, p.nodes) for p in plans] == [(KIND_GANG, 2), (KIND_SHARES, 2)]
    assert plans[0].tier_label == "topology.k8s.aws/network-node-layer-3"
    assert "capped at 2 of 5" in plans[1].reason
    assert sum(p.nodes for p in plans) <= 4


def test_a_gang_larger_than_the_cap_waits_whole() -> None:
    gang = GangDemand("ns/big", tuple(f"ns/big-{i}" for i in range(5)), 5, 8, "tier", ("gang",))
    assert plan_buffers(shares=[], migs=[], gangs=[gang], pools=POOLS, max_nodes=4) == ()


def test_mig_demand_gets_its_own_buffer() -> None:
    (plan,) = plan_buffers(
        shares=[], migs=[MigDemand("ns/m", {"3g.40gb": 3}, ("mig",))], gangs=[], pools=POOLS, max_nodes=8
    )
    assert (plan.kind, plan.nodes, plan.name) == (KIND_MIG, 1, "gpuweave-mig-mig")


def test_buffer_names_are_bounded_and_safe() -> None:
    assert buffer_name(KIND_SHARES, "Pool_With.Odd" + "x" * 100).startswith("gpuweave-shares-pool-with-odd")
    assert len(buffer_name(KIND_SHARES, "x" * 300)) <= 60
    assert buffer_name(KIND_GANG, "ns/a") != buffer_name(KIND_GANG, "ns/b")


# --- reading demand: the extender's own core over listed objects ---------------------------------

TAINT = {"key": "e2e/pool", "value": "shares", "effect": "NoSchedule"}


def _config() -> CapacityConfig:
    model = PoolModel.model_validate(
        {"nodePool": "shares", "instanceType": "p5.48xlarge", "offers": "fractional"}
    )
    offer, inventory = offer_of(model)
    return CapacityConfig("gpuweave-system", 4, {"shares": offer}, {"shares": inventory})


def _nodepool() -> dict[str, Any]:
    return {"metadata": {"name": "shares"}, "spec": {"template": {"spec": {"taints": [TAINT]}}}}


def _pod(name: str, compute: str, *, node: str = "") -> dict[str, Any]:
    status: dict[str, Any] = (
        {"phase": "Running"}
        if node
        else {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    )
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "gpuweave-scheduler",
            "nodeName": node or None,
            "tolerations": [{"key": "e2e/pool", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "resources": {"limits": {"gpuweave.io/gpu-compute": compute}}}],
        },
        "status": status,
    }


def _share_node(name: str) -> list[dict[str, Any]]:
    inventory = load_profile("p5.48xlarge").to_inventory(node_name=name)
    node = {
        "kind": "Node",
        "metadata": {"name": name, "labels": {LABEL_NODEPOOL: "shares", "kubernetes.io/hostname": name}},
        "spec": {"taints": [TAINT]},
        "status": {"allocatable": {"cpu": "192", "memory": "2048Gi", "pods": "110"}},
    }
    sharing = SharingPlan(default=GpuSharing(SharingMode.FRACTIONAL, 4))
    return [node, {**inventory_object(inventory, sharing=sharing), "kind": NODE_INVENTORY_KIND}]


def test_a_share_that_fits_no_node_is_demand_for_the_pool() -> None:
    view = ClusterView.of([_pod("a", "30"), _pod("b", "30")])
    demand = read_demand(view, NewMachines(_config()), {"shares": _nodepool()})
    assert [(d.pod, d.compute, d.pools) for d in demand.shares] == [
        ("ns/a", 30, ("shares",)),
        ("ns/b", 30, ("shares",)),
    ]


def test_a_share_that_fits_a_node_now_is_never_buffered() -> None:
    view = ClusterView.of([*_share_node("n1"), _pod("a", "30")])
    demand = read_demand(view, NewMachines(_config()), {"shares": _nodepool()})
    assert demand.shares == ()
    assert demand.arriving == {"ns/a"}  # a buffer that asked for it holds its machine until bound


def test_a_pod_the_pool_taint_keeps_out_is_no_demand_for_it() -> None:
    pod = _pod("a", "30")
    pod["spec"]["tolerations"] = []
    view = ClusterView.of([pod])
    assert read_demand(view, NewMachines(_config()), {"shares": _nodepool()}).shares == ()


def test_a_share_that_fits_no_other_node_keeps_its_node() -> None:
    alone = ClusterView.of([*_share_node("n1"), _pod("a", "90", node="n1")])
    assert shares_stuck(alone, pools={"shares"}) == {"n1": {"ns/a"}}
    movable = ClusterView.of([*_share_node("n1"), *_share_node("n2"), _pod("a", "90", node="n1")])
    assert shares_stuck(movable, pools={"shares"}) == {}


def _mig_setup() -> tuple[NewMachines, dict[str, Any]]:
    model = PoolModel.model_validate({"nodePool": "mig", "instanceType": "p5.48xlarge", "offers": "mig"})
    offer, inventory = offer_of(model)
    config = CapacityConfig("gpuweave-system", 4, {"mig": offer}, {"mig": inventory})
    return NewMachines(config), {"mig": {"metadata": {"name": "mig"}, "spec": {}}}


def _mig_pod(annotations: dict[str, str]) -> dict[str, Any]:
    pod = _pod("m", "0")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-3g.40gb": "1"}
    pod["metadata"]["annotations"] = annotations
    return pod


def test_a_mig_pod_a_node_claimed_is_capacity_on_its_way_not_demand() -> None:
    machines, nodepools = _mig_setup()
    unclaimed = read_demand(ClusterView.of([_mig_pod({})]), machines, nodepools)
    assert [(d.pod, dict(d.profiles)) for d in unclaimed.migs] == [("ns/m", {"3g.40gb": 1})]
    claim = {
        "gpuweave.io/mig-demand-claim": "n1",
        "gpuweave.io/mig-demand-claim-time": "2026-01-01T00:00:00Z",
    }
    node = {"kind": "Node", "metadata": {"name": "n1", "labels": {}}, "spec": {}, "status": {}}
    assert read_demand(ClusterView.of([node, _mig_pod(claim)]), machines, nodepools).migs == ()
    gone = read_demand(ClusterView.of([_mig_pod(claim)]), machines, nodepools)  # its node went
    assert len(gone.migs) == 1
