"""Property: over random streams of gang members, plain pods, deletes, clock steps and extender restarts,
no device is ever held twice: not by two pods' assignments, and never by a pod and a gang's
reservation at once; every reservation's devices are free again after its TTL."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects
from scheduler_ext.gangs.book import SLOT_PREFIX
from scheduler_ext.gangs.service import GangSettings
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs
from topology.network import LABEL_AWS_LAYER_3

NODES = {"n0": "dgx-h100", "n1": "dgx-h100", "n2": "p5.48xlarge", "n3": "l40s-pcie-8", "n4": "dgx-h100"}
BLOCKS = {"n0": "a", "n1": "a", "n2": "b", "n3": "b", "n4": "c"}
TTL_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _objects() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for name, profile in NODES.items():
        objects += [
            node_object(name, gpus=8, labels={LABEL_AWS_LAYER_3: BLOCKS[name]}),
            inventory_object(profile_inventory(profile, name)),
        ]
    return objects


def _extender(objects: list[dict[str, Any]], clock: Clock) -> Extender:
    settings = GangSettings(ttl_s=TTL_S, clock=clock)
    cache, core = build_core(gangs=settings)
    apply_objects(iter(objects), cache)
    extender = assemble(cache, core, SnapshotBinder(cache), gangs=settings)
    assert extender.gangs is not None
    extender.gangs.rebuild()
    return extender


def _schedule(extender: Extender, pod: dict[str, Any]) -> None:
    args = ExtenderArgs.model_validate({"Pod": pod, "NodeNames": list(NODES)})
    passed = extender.service.filter(args, pod).NodeNames or []
    if passed:
        meta = pod["metadata"]
        extender.service.bind(
            ExtenderBindingArgs(
                PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=passed[0]
            )
        )


def _check(extender: Extender) -> None:
    annotated: Counter[tuple[str, str]] = Counter()
    for pod in extender.cache.pod_objects():
        raw = (pod.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_ASSIGNMENT)
        if raw:
            assignment = PodAssignment.from_annotation(raw)
            annotated.update((assignment.node, d) for d in assignment.all_device_ids())
    assert all(count == 1 for count in annotated.values()), annotated.most_common(3)
    held: Counter[tuple[str, str]] = Counter()
    for name in NODES:
        for record in extender.cache.holdings_on(name):
            held.update((name, d) for d in record.devices)
    assert all(count == 1 for count in held.values()), held.most_common(3)
    slots = {
        (n, d)
        for n in NODES
        for r in extender.cache.holdings_on(n)
        if r.uid.startswith(SLOT_PREFIX)
        for d in r.devices
    }
    assert not slots & set(annotated)  # a reservation never covers a bound pod's device


OPS = st.one_of(
    st.tuples(
        st.just("gang"),
        st.integers(0, 3),
        st.integers(0, 4),
        st.sampled_from([2, 3, 4]),
        st.sampled_from([2, 4, 8]),
    ),
    st.tuples(st.just("plain"), st.sampled_from([1, 4, 8])),
    st.tuples(st.just("delete"), st.integers(0, 50)),  # the watch's delete of a pod, pending or bound
    st.tuples(st.just("tick"), st.sampled_from([5.0, 31.0])),
    st.tuples(st.just("restart")),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=3, max_size=25))
def test_no_device_is_held_twice_across_gangs_expiry_and_restarts(ops: list[tuple[Any, ...]]) -> None:
    clock = Clock()
    extender = _extender(_objects(), clock)
    shapes: dict[int, tuple[int, int]] = {}  # gang -> (size, GPUs per member): members are alike
    for step, op in enumerate(ops):
        if op[0] == "gang":
            _, gang, member, size, gpus = op
            size, gpus = shapes.setdefault(gang, (size, gpus))
            annotations = {ANNOTATION_GANG: f"g{gang}", ANNOTATION_GANG_SIZE: str(size)}
            _schedule(
                extender,
                pod_object(f"g{gang}-{member}", limits={RESOURCE_GPU: gpus}, annotations=annotations),
            )
        elif op[0] == "plain":
            _schedule(extender, pod_object(f"p{step}", limits={RESOURCE_GPU: op[1]}))
        elif op[0] == "delete":
            known = sorted(str(p["metadata"]["uid"]) for p in extender.cache.pod_objects())
            if known:
                extender.cache.delete_pod(known[op[1] % len(known)])
        elif op[0] == "tick":
            clock.now += op[1]
        else:
            pods = [dict(p) for p in extender.cache.pod_objects()]
            extender.close()
            extender = _extender([*_objects(), *pods], clock)
        _check(extender)
    clock.now += TTL_S
    assert extender.gangs is not None
    extender.gangs.sweep()
    assert not any(r.uid.startswith(SLOT_PREFIX) for n in NODES for r in extender.cache.holdings_on(n))
    extender.close()
