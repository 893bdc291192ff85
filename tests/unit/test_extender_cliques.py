"""Pods that are not gangs go to the fullest NVLink clique among their best nodes, keeping whole
cliques free for gangs; gangs, and fleets without cliques, are scored as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, build_snapshot_extender
from scheduler_ext.decide.cliques import best_fit_cliques
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, parse
from topology.network import LABEL_AWS_LAYER_3, LABEL_GPU_CLIQUE

A, B = "6a2b1c3d-0000-4000-8000-00000000aaaa.1", "6a2b1c3d-0000-4000-8000-00000000aaaa.2"


def _extender(tmp_path: Path, cliques: dict[str, str | None]) -> Extender:
    items: list[dict[str, Any]] = []
    for name, clique in cliques.items():
        labels = {LABEL_AWS_LAYER_3: "block-1"} | ({LABEL_GPU_CLIQUE: clique} if clique else {})
        items += [
            node_object(name, gpus=4, labels=labels),
            inventory_object(profile_inventory("gb200-compute-tray", name)),
        ]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return build_snapshot_extender(path)


def _scores(extender: Extender, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    hosts, scores = extender.service.prioritize(parse(ExtenderArgs, {"Pod": pod, "NodeNames": names}), pod)
    return dict(zip(hosts, scores, strict=True))


def _hold_one_gpu(extender: Extender, node: str) -> None:
    pod = pod_object(f"busy-{node}", limits={RESOURCE_GPU: 1})
    meta = pod["metadata"]
    result = extender.service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": [node]}), pod)
    assert result.NodeNames == [node]
    args = ExtenderBindingArgs(PodName=meta["name"], PodNamespace="default", PodUID=meta["uid"], Node=node)
    assert extender.service.bind(args) == ""


NODES = {"a0": A, "a1": A, "a2": A, "b0": B, "b1": B, "b2": B, "b3": B}


def test_a_whole_tray_pod_goes_to_the_clique_with_fewer_whole_free_trays(tmp_path: Path) -> None:
    extender = _extender(tmp_path, dict(NODES))
    _hold_one_gpu(extender, "a0")  # clique A: 2 whole free trays, clique B: 4
    scores = _scores(extender, pod_object("tray", limits={RESOURCE_GPU: 4}), list(NODES))
    assert scores == {"a0": 0, "a1": 10, "a2": 10, "b0": 9, "b1": 9, "b2": 9, "b3": 9}


def test_gang_members_and_fleets_without_cliques_are_scored_as_before(tmp_path: Path) -> None:
    extender = _extender(tmp_path, dict(NODES))
    _hold_one_gpu(extender, "a0")
    annotations = {ANNOTATION_GANG: "job", ANNOTATION_GANG_SIZE: "2"}
    member = pod_object("member", limits={RESOURCE_GPU: 4}, annotations=annotations)
    assert set(_scores(extender, member, list(NODES)).values()) == {0, 10}
    alone = {ANNOTATION_GANG: "solo", ANNOTATION_GANG_SIZE: "1"}  # a gang of one: scored as any pod
    solo = pod_object("solo", limits={RESOURCE_GPU: 4}, annotations=alone)
    assert _scores(extender, solo, list(NODES)) == {
        "a0": 0,
        "a1": 10,
        "a2": 10,
        "b0": 9,
        "b1": 9,
        "b2": 9,
        "b3": 9,
    }
    plain = _extender(tmp_path, dict.fromkeys(NODES))
    _hold_one_gpu(plain, "a0")
    assert set(_scores(plain, pod_object("tray", limits={RESOURCE_GPU: 4}), list(NODES)).values()) == {0, 10}


def test_best_fit_leaves_unlabelled_and_lower_scores_alone() -> None:
    names = ["x", "a", "b", "c"]
    clique = {"a": "A", "b": "B", "c": "B"}.get
    free = {"A": 3, "B": 1}.__getitem__
    assert best_fit_cliques(names, [10, 10, 10, 7], clique, free) == [10, 9, 10, 7]
    assert best_fit_cliques(names, [10, 10, 9, 9], clique, free) == [10, 10, 9, 9]  # one clique at 10
