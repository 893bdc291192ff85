"""Property: over random clusters and pod streams, no device is ever held by two pods,
also across an extender restart that rebuilds its state from the recorded annotations."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_PLACEMENT,
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
)
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs

PROFILES = ("p5.48xlarge", "dgx1-v100", "a100-pcie-nvbridge-4", "l40s-pcie-8")
REQUESTS: tuple[dict[str, int], ...] = (
    {RESOURCE_GPU: 1},
    {RESOURCE_GPU: 2},
    {RESOURCE_GPU: 4},
    {RESOURCE_GPU: 8},
    {RESOURCE_GPU: 2, RESOURCE_EFA: 1},
    {RESOURCE_GPU_COMPUTE: 30, RESOURCE_GPU_MEMORY: 8},
    {RESOURCE_GPU_COMPUTE: 60},
)


def _cluster(profiles: list[str], fractional: list[bool]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for i, (profile, shares) in enumerate(zip(profiles, fractional, strict=True)):
        name = f"node-{i}"
        inventory = profile_inventory(profile, name)
        sharing = {"0": {"mode": "fractional"}, "1": {"mode": "fractional"}} if shares else None
        objects += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory, sharing=sharing)]
    return objects


def _extender(objects: list[Any]) -> Extender:
    cache, core = build_core()
    apply_objects(iter(objects), cache)
    return assemble(cache, core, SnapshotBinder(cache))


def _held(extender: Extender) -> Counter[tuple[str, str]]:
    """(node, device ID) -> number of pods whose annotation names it."""
    counts: Counter[tuple[str, str]] = Counter()
    for pod in extender.cache.pod_objects():
        raw = (pod.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_ASSIGNMENT)
        if raw:
            assignment = PodAssignment.from_annotation(raw)
            counts.update((assignment.node, d) for d in assignment.all_device_ids())
    return counts


def _schedule(extender: Extender, pod: dict[str, Any], nodes: list[str], pick: int) -> bool:
    args = ExtenderArgs.model_validate({"Pod": pod, "NodeNames": nodes})
    passed = extender.service.filter(args, pod).NodeNames or []
    if not passed:
        return False
    hosts, values = extender.service.prioritize(args.model_copy(update={"NodeNames": passed}), pod)
    scores = dict(zip(hosts, values, strict=True))
    best = sorted(passed, key=lambda n: (-scores[n], n))[pick % len(passed)]
    meta = pod["metadata"]
    error = extender.service.bind(
        ExtenderBindingArgs(
            PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=best
        )
    )
    return error == ""


operation = st.tuples(st.sampled_from(["pod", "pod", "pod", "delete", "restart"]), st.integers(0, 50))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    profiles=st.lists(st.sampled_from(PROFILES), min_size=1, max_size=4),
    fractional=st.lists(st.booleans(), min_size=4, max_size=4),
    operations=st.lists(operation, min_size=1, max_size=40),
)
def test_no_device_is_ever_held_twice(
    profiles: list[str], fractional: list[bool], operations: list[Any]
) -> None:
    base = _cluster(profiles, fractional[: len(profiles)])
    nodes = [f"node-{i}" for i in range(len(profiles))]
    extender = _extender(base)
    bound: list[str] = []
    for step, (kind, number) in enumerate(operations):
        if kind == "pod":
            limits = REQUESTS[number % len(REQUESTS)]
            annotations = {ANNOTATION_PLACEMENT: "nvlink-required"} if number % 5 == 0 else {}
            pod = pod_object(f"p{step}", limits=limits, annotations=annotations)
            if _schedule(extender, pod, nodes, number):
                bound.append(pod["metadata"]["uid"])
        elif kind == "delete" and bound:
            extender.cache.delete_pod(bound.pop(number % len(bound)))
        elif kind == "restart":
            before = _held(extender)
            extender = _extender(base + [dict(p) for p in extender.cache.pod_objects()])
            assert _held(extender) == before
            for uid in bound:
                holding = extender.cache.holding(uid)
                assert holding is not None and not holding.assumed
        held = _held(extender)
        assert all(count == 1 for count in held.values()), [k for k, c in held.items() if c > 1]
        for node in nodes:
            state = extender.cache.node(node)
            assert state is not None
            in_state = set(state.holders)
            assert in_state == {d for (n, d) in held if n == node}


def test_concurrent_binds_to_one_node_never_double_book() -> None:
    extender = _extender(_cluster(["p5.48xlarge"], [False]))
    pods = [pod_object(f"c{i}", limits={RESOURCE_GPU: 3}) for i in range(12)]
    for pod in pods:
        extender.cache.remember_pod(pod)
    errors: list[str] = []
    barrier = threading.Barrier(len(pods))

    def bind(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        barrier.wait()
        errors.append(
            extender.service.bind(
                ExtenderBindingArgs(
                    PodName=meta["name"], PodNamespace="default", PodUID=meta["uid"], Node="node-0"
                )
            )
        )

    threads = [threading.Thread(target=bind, args=(pod,)) for pod in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(1 for e in errors if e == "") == 2  # 8 GPUs hold two 3-GPU pods
    held = _held(extender)
    assert len(held) == 6 and set(held.values()) == {1}
