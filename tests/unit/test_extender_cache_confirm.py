"""The watch confirming a bind: the assumed holding is kept as is when the annotated pod shows
the same devices, and replaced (with the node's state rebuilt) when it shows others."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.snapshot import apply_objects
from scheduler_ext.serving.wire import ExtenderBindingArgs


class Recorder:
    """A binder that only records: the API server's answer arrives later, by the watch."""

    def __init__(self) -> None:
        self.bound: list[dict[str, Any]] = []

    def bind(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment | None) -> None:
        echoed = copy.deepcopy(dict(pod))
        echoed["spec"]["nodeName"] = node
        assert assignment is not None
        echoed["metadata"].setdefault("annotations", {})[ANNOTATION_ASSIGNMENT] = assignment.to_annotation()
        self.bound.append(echoed)


def _bound(gpus: int) -> tuple[Extender, Recorder, dict[str, Any]]:
    cache, core = build_core()
    inventory = profile_inventory("dgx-h100", "n0")
    apply_objects(iter([node_object("n0", gpus=8), inventory_object(inventory)]), cache)
    recorder = Recorder()
    extender = assemble(cache, core, recorder)
    pod = pod_object("p", limits={RESOURCE_GPU: gpus})
    cache.remember_pod(pod)
    meta = pod["metadata"]
    args = ExtenderBindingArgs(PodName=meta["name"], PodNamespace="default", PodUID=meta["uid"], Node="n0")
    assert extender.service.bind(args) == ""
    return extender, recorder, recorder.bound[0]


def test_the_watch_showing_the_assumed_devices_confirms_without_a_rebuild() -> None:
    extender, _, echoed = _bound(2)
    cache = extender.cache
    uid = echoed["metadata"]["uid"]
    holding = cache.holding(uid)
    assert holding is not None and holding.assumed
    state = cache.node("n0")
    cache.upsert_pod(echoed)
    confirmed = cache.holding(uid)
    assert confirmed is not None and not confirmed.assumed and confirmed.record == holding.record
    assert cache.node("n0") is state  # the same holders: the state object is kept
    assert state is not None and len(state.holders) == 2
    echoed["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    cache.upsert_pod(echoed)  # a status update changes nothing the cache keeps
    assert cache.node("n0") is state and cache.holding(uid) == confirmed
    echoed["status"] = {"phase": "Succeeded"}
    cache.upsert_pod(echoed)  # ended: the devices are free again
    freed = cache.node("n0")
    assert cache.holding(uid) is None and freed is not None and not freed.holders


def test_the_watch_showing_other_devices_replaces_the_holding_and_rebuilds() -> None:
    extender, _, echoed = _bound(2)
    cache = extender.cache
    uid = echoed["metadata"]["uid"]
    assumed = cache.holding(uid)
    assert assumed is not None
    state = cache.node("n0")
    assert state is not None
    annotation = PodAssignment.from_annotation(echoed["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
    container = next(iter(annotation.containers.values()))
    resource = next(iter(container.devices))
    taken = set(assumed.record.devices)
    free = [u.uuid for u in profile_inventory("dgx-h100", "n0").gpus if u.uuid not in taken][:2]
    containers = {
        name: c.model_copy(update={"devices": {resource: free}}) for name, c in annotation.containers.items()
    }
    changed = annotation.model_copy(update={"containers": containers})
    echoed["metadata"]["annotations"][ANNOTATION_ASSIGNMENT] = changed.to_annotation()
    cache.upsert_pod(echoed)
    holding = cache.holding(uid)
    assert holding is not None and not holding.assumed and holding.record.devices == frozenset(free)
    rebuilt = cache.node("n0")
    assert rebuilt is not state and rebuilt is not None
    assert {d for d, owner in rebuilt.holders.items() if owner == uid} == set(free)


def test_the_kubelet_writing_the_start_time_keeps_it_without_a_rebuild() -> None:
    """A gang waiting for its tightest tier counts a running pod's end from its start time: the
    status update that brings it is kept on the holding, and the node's state is not rebuilt."""
    extender, _, echoed = _bound(2)
    cache = extender.cache
    uid = echoed["metadata"]["uid"]
    cache.upsert_pod(echoed)
    state = cache.node("n0")
    echoed["metadata"]["annotations"]["gpuweave.io/expected-duration"] = "2h"
    echoed["status"] = {"phase": "Running", "startTime": "2026-01-02T03:04:05Z"}
    cache.upsert_pod(echoed)
    holding = cache.holding(uid)
    assert holding is not None and holding.record.started_s == 1767323045.0
    assert holding.record.expected_s == 7200.0
    assert cache.node("n0") is state
