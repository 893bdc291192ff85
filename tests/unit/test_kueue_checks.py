"""The gpuweave.io/gpu-health Kueue admission check's decisions (scheduler_ext.kueue.checks)."""

from __future__ import annotations

from typing import Any

import pytest

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import LABEL_JOBSET_NAME, LABEL_KUEUE_POD_GROUP
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.kueue.checks import (
    HeldFault,
    PodSetNeed,
    free_gpus_by_node,
    held_faults,
    parse_workload,
    pod_set_needs,
    verdict_for_admission,
    verdict_for_faults,
)
from scheduler_ext.kueue.controller import LABEL_JOB, KueueChecks, owner_of_pod, requeue_owner


def _cache(nodes: dict[str, tuple[str, ...]]) -> ClusterCache:
    """Nodes of 8 H100s (name -> the UUIDs of its GPUs that are unhealthy)."""
    cache = ClusterCache(LayoutRegistry())
    for name, unhealthy in nodes.items():
        cache.upsert_node(node_object(name, gpus=8))
        cache.upsert_inventory(inventory_object(profile_inventory("dgx-h100", name), unhealthy=unhealthy))
    return cache


def _gpus(node: str) -> list[str]:
    return [g.uuid for g in profile_inventory("dgx-h100", node).gpus]


def _hold(
    cache: ClusterCache, name: str, node: str, devices: list[str], resource: str = RESOURCE_GPU
) -> None:
    assignment = PodAssignment(
        node=node, containers={"main": ContainerAssignment(devices={resource: devices})}
    )
    pod = pod_object(
        name,
        uid=f"uid-{name}",
        node=node,
        limits={resource: len(devices)},
        annotations={ANNOTATION_ASSIGNMENT: assignment.to_annotation()},
    )
    cache.upsert_pod(pod)


def _workload(pod_sets: list[tuple[str, int, int]], **status: Any) -> dict[str, Any]:
    """A Workload of pod sets (name, count, GPUs per pod) owned by JobSet ``train``."""
    sets = [
        {
            "name": name,
            "count": count,
            "template": {
                "spec": {"containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU: str(g)}}}]}
            },
        }
        for name, count, g in pod_sets
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "jobset-train-1",
            "namespace": "ml",
            "ownerReferences": [{"kind": "JobSet", "name": "train", "controller": True, "uid": "u"}],
        },
        "spec": {"podSets": sets},
        "status": status,
    }


def test_two_eight_gpu_pods_are_ready_on_two_free_nodes_and_pending_when_one_gpu_failed() -> None:
    cache = _cache({"a": (), "b": ()})
    needs = pod_set_needs(parse_workload(_workload([("workers", 2, 8)])), {})
    assert needs == [PodSetNeed("workers", 2, 8, None)]
    ready = verdict_for_admission(needs, free_gpus_by_node(cache.states()))
    assert ready.state == "Ready" and ready.message == "16 GPUs fit on healthy free devices"

    broken = _cache({"a": (_gpus("a")[3],), "b": ()})
    pending = verdict_for_admission(needs, free_gpus_by_node(broken.states()))
    assert pending.state == "Pending"
    assert "pod set workers needs 2 pods x 8 GPUs, 1 fit" in pending.message
    assert pending.message.endswith(": 7, 0")  # b's 8 went to the first pod; a has 7 healthy


def test_held_gpus_do_not_count_and_best_fit_leaves_the_big_hole() -> None:
    cache = _cache({"a": (), "b": ()})
    _hold(cache, "other", "a", _gpus("a")[:4])  # a: 4 free, b: 8 free
    small_first = [PodSetNeed("small", 1, 4, None), PodSetNeed("big", 1, 8, None)]
    assert (
        verdict_for_admission(small_first, free_gpus_by_node(cache.states())).state == "Ready"
    )  # 4 on a, 8 on b
    assert (
        verdict_for_admission([PodSetNeed("big", 2, 8, None)], free_gpus_by_node(cache.states())).state
        == "Pending"
    )


def test_a_flavor_limits_the_nodes_counted() -> None:
    cache = _cache({"a": (), "b": ()})
    workload = parse_workload(
        _workload(
            [("workers", 2, 8)],
            admission={
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": "workers", "count": 2, "flavors": {RESOURCE_GPU: "only-a"}}],
            },
        )
    )
    needs = pod_set_needs(workload, {"only-a": frozenset({"a"})})
    assert needs == [PodSetNeed("workers", 2, 8, frozenset({"a"}))]
    assert verdict_for_admission(needs, free_gpus_by_node(cache.states())).state == "Pending"
    assert (
        verdict_for_admission(pod_set_needs(workload, {}), free_gpus_by_node(cache.states())).state == "Ready"
    )


def test_pods_without_whole_gpus_are_always_ready() -> None:
    workload = _workload([("cpu", 3, 0)])
    needs = pod_set_needs(parse_workload(workload), {})
    assert verdict_for_admission(needs, free_gpus_by_node(_cache({}).states())).state == "Ready"


def test_a_failed_gpu_under_a_pod_is_a_held_fault_and_retries_its_workload() -> None:
    gpus = _gpus("a")
    cache = _cache({"a": (gpus[1],)})
    _hold(cache, "worker-0", "a", gpus[:4])
    _hold(cache, "idle-neighbour", "a", gpus[4:6])
    faults = held_faults(cache.states())
    assert faults == [HeldFault(node="a", device=gpus[1], pod_uid="uid-worker-0")]
    verdict = verdict_for_faults(parse_workload(_workload([("w", 1, 4)])), [(faults[0], "ml/worker-0")])
    assert verdict is not None and verdict.state == "Retry"
    assert f"device {gpus[1]} on node a failed under pod ml/worker-0" in verdict.message
    assert verdict_for_faults(parse_workload(_workload([("w", 1, 4)])), []) is None


def test_a_share_of_a_failed_gpu_is_a_held_fault_of_that_gpu() -> None:
    gpus = _gpus("a")
    cache = ClusterCache(LayoutRegistry())
    cache.upsert_node(node_object("a", gpus=8))
    sharing = {gpus[0]: {"mode": "fractional", "replicas": 1}}
    inventory = profile_inventory("dgx-h100", "a")
    cache.upsert_inventory(inventory_object(inventory, unhealthy=(gpus[0],), sharing=sharing))
    _hold(cache, "slice", "a", [f"{gpus[0]}::compute-0", f"{gpus[0]}::compute-1"], RESOURCE_GPU_COMPUTE)
    assert held_faults(cache.states()) == [HeldFault(node="a", device=gpus[0], pod_uid="uid-slice")]


def test_a_workload_that_does_not_parse_is_refused_with_the_field() -> None:
    with pytest.raises(InvalidInputError, match="metadata"):
        parse_workload({"metadata": {"name": ""}})
    bad = _workload([("w", 1, 1)])
    bad["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU] = (
        "1.5"
    )
    with pytest.raises(InvalidInputError, match="pod set w"):
        pod_set_needs(parse_workload(bad), {})


def test_the_workload_names_its_owner_and_its_check_state() -> None:
    status = {"admissionChecks": [{"name": "other", "state": "Ready"}, {"name": "mine", "state": "Pending"}]}
    workload = parse_workload(_workload([("w", 1, 1)], **status))
    assert workload.owner() == ("JobSet", "train")
    check = workload.check({"mine"})
    assert check is not None and check.state == "Pending"
    assert workload.check({"absent"}) is None


@pytest.mark.parametrize(
    ("labels", "owner"),
    [
        ({LABEL_JOBSET_NAME: "train", LABEL_JOB: "train-workers-0"}, ("ml", "JobSet", "train")),
        ({LABEL_JOB: "solo"}, ("ml", "Job", "solo")),
        ({"job-name": "old"}, ("ml", "Job", "old")),
        ({LABEL_KUEUE_POD_GROUP: "group"}, ("ml", "group", "group")),
        ({}, ("ml", "Pod", "p-0")),
    ],
)
def test_a_pod_names_its_workload_by_the_labels_its_controller_set(
    labels: dict[str, str], owner: tuple[str, str, str]
) -> None:
    assert owner_of_pod("ml", "p-0", labels) == owner
    named = owner_of_pod("ml", "p-0", labels, {"kueue.x-k8s.io/workload": "jobset-train-1"})
    assert named == ("ml", "Workload", "jobset-train-1")  # Kueue's annotation names it outright


def test_a_workload_of_pods_is_found_by_its_group_or_its_one_pod() -> None:
    jobset = parse_workload(_workload([("w", 1, 1)]))
    assert KueueChecks.owner_keys(jobset) == [("ml", "Workload", "jobset-train-1"), ("ml", "JobSet", "train")]
    raw = _workload([("w", 1, 1)])
    raw["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "p-0", "controller": True}]
    assert KueueChecks.owner_keys(parse_workload(raw)) == [
        ("ml", "Workload", "jobset-train-1"),
        ("ml", "group", "jobset-train-1"),
        ("ml", "Pod", "p-0"),
    ]


def test_a_pod_that_opts_out_of_health_eviction_or_moves_alone_requeues_nothing() -> None:
    labels = {LABEL_JOBSET_NAME: "train"}
    assert requeue_owner("ml", "p-0", labels, {}) == ("ml", "JobSet", "train")
    opted_out = {**labels, "gpuweave.io/no-health-eviction": "true"}
    assert requeue_owner("ml", "p-0", opted_out, {}) is None
    assert requeue_owner("ml", "p-0", labels, {"gpuweave.io/gang-eviction": "pod"}) is None
    assert requeue_owner("ml", "p-0", {LABEL_JOB: "solo"}, {}) == ("ml", "Job", "solo")


def test_best_fit_keeps_whole_nodes_for_whole_node_pods_at_any_cluster_size() -> None:
    free = {f"n{i}": 8 for i in range(2000)} | {f"h{i}": 4 for i in range(3)}
    halves_listed_first = [PodSetNeed("half", 3, 4, None), PodSetNeed("whole", 2000, 8, None)]
    assert verdict_for_admission(halves_listed_first, free).state == "Ready"  # halves on the h nodes
    one_too_many = [PodSetNeed("half", 4, 4, None), PodSetNeed("whole", 2000, 8, None)]
    pending = verdict_for_admission(one_too_many, free)  # wholes placed first: no node left for a 4th half
    assert pending.state == "Pending"
    assert "pod set half needs 4 pods x 4 GPUs, 3 fit" in pending.message
    assert pending.message.endswith("nodes: 0, 0, 0, 0")  # the four fullest named
