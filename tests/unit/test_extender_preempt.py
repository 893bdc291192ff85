"""Preemption: the fewest device-holding victims, lowest priority first, never a higher priority."""

from __future__ import annotations

from typing import Any

from devicemodel.contracts import ANNOTATION_PLACEMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects
from scheduler_ext.serving.wire import ExtenderBindingArgs, ExtenderPreemptionArgs


def _extender_with(pods: list[tuple[str, int, int]]) -> Extender:
    """One dgx1-v100 node ("n") with pods (name, GPUs, priority) bound in order."""
    cache, core = build_core()
    inventory = profile_inventory("dgx1-v100", "n")
    apply_objects(iter([node_object("n", gpus=8), inventory_object(inventory)]), cache)
    extender = assemble(cache, core, SnapshotBinder(cache))
    for name, gpus, priority in pods:
        pod = pod_object(name, limits={RESOURCE_GPU: gpus}, priority=priority)
        cache.remember_pod(pod)
        error = extender.service.bind(
            ExtenderBindingArgs(PodName=name, PodNamespace="default", PodUID=pod["metadata"]["uid"], Node="n")
        )
        assert error == "", error
    return extender


def _victims(extender: Extender, pod: dict[str, Any], proposed: list[str]) -> list[str] | None:
    args = ExtenderPreemptionArgs.model_validate(
        {
            "Pod": pod,
            "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": u} for u in proposed], "NumPDBViolations": 0}},
        }
    )
    result = extender.service.preempt(args, pod).NodeNameToMetaVictims
    return [p.UID for p in result["n"].Pods or []] if "n" in result else None


def test_adds_only_as_many_lowest_priority_victims_as_the_fit_needs() -> None:
    extender = _extender_with([("a", 2, 5), ("b", 2, 1), ("c", 2, 3)])  # 2 GPUs stay free
    urgent = pod_object("urgent", limits={RESOURCE_GPU: 4}, priority=100)
    assert _victims(extender, urgent, []) == ["uid-default-b"]


def test_proposed_victims_are_kept_and_higher_priority_pods_are_never_named() -> None:
    extender = _extender_with([("vip", 6, 1000), ("low", 2, 0)])
    pod = pod_object("mid", limits={RESOURCE_GPU: 4}, priority=10)
    assert _victims(extender, pod, ["uid-default-cpu-only"]) is None  # only "low" could go: not enough
    small = pod_object("small", limits={RESOURCE_GPU: 2}, priority=10)
    assert _victims(extender, small, ["uid-default-cpu-only"]) == ["uid-default-cpu-only", "uid-default-low"]


def test_topology_policy_decides_which_victims_help() -> None:
    extender = _extender_with([("x", 4, 1), ("y", 2, 1)])
    pod = pod_object(
        "mesh", limits={RESOURCE_GPU: 4}, annotations={ANNOTATION_PLACEMENT: "nvlink-required"}, priority=50
    )
    victims = _victims(extender, pod, [])
    assert victims is not None and len(victims) == 1
    state = extender.cache.node("n")
    assert state is not None
    freed = {d for d, uid in state.holders.items() if uid in victims}
    assert len(freed) >= 2  # it frees GPUs that, with the free ones, form an NVLink quad
