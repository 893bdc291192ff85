"""Filter's shortlist: at most ``keep`` fitting nodes, the best-ranked first, fuller nodes among
equals, every fitting node for pods whose soft preferences kube-scheduler must weigh."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import build_snapshot_extender
from scheduler_ext.decide.shortlist import shortlist, weighs_soft_preferences
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, parse

NODES = [f"n{i}" for i in range(12)]


def _cluster(tmp_path: Path) -> Path:
    items: list[dict[str, Any]] = []
    for name in NODES:
        inventory = profile_inventory("dgx-h100", name)
        items += [node_object(name, gpus=8), inventory_object(inventory)]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return path


def _filter(service: ExtenderService, pod: dict[str, Any]) -> list[str]:
    return list(service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": NODES}), pod).NodeNames or [])


def _place(service: ExtenderService, name: str, gpus: int, node: str) -> None:
    pod = pod_object(name, limits={RESOURCE_GPU: gpus})
    service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": [node]}), pod)
    args = ExtenderBindingArgs(PodName=name, PodNamespace="default", PodUID=pod["metadata"]["uid"], Node=node)
    assert service.bind(args) == ""


def test_filter_passes_at_most_keep_nodes_and_never_one_ranked_below_a_node_left_out(tmp_path: Path) -> None:
    extender = build_snapshot_extender(_cluster(tmp_path), keep=3)
    service = extender.service
    for node in ("n4", "n7", "n9"):
        _place(service, f"holder-{node}", 4, node)
    _place(service, "holder-n2", 1, "n2")
    pod = pod_object("one", limits={RESOURCE_GPU: 1})
    passed = _filter(service, pod)
    hosts, scores = service.prioritize(parse(ExtenderArgs, {"Pod": pod, "NodeNames": NODES}), pod)
    rank = dict(zip(hosts, scores, strict=True))
    assert len(passed) == 3
    left_out = set(NODES) - set(passed)
    assert min(rank[n] for n in passed) >= max(rank[n] for n in left_out)  # never a worse node kept
    best = {n for n in NODES if rank[n] == max(rank.values())}
    assert best <= set(passed) and best <= {"n2", "n4", "n7", "n9"}  # the best are partly used nodes
    extender.close()


def test_keep_zero_and_pods_with_soft_preferences_get_every_fitting_node(tmp_path: Path) -> None:
    plain = pod_object("plain", limits={RESOURCE_GPU: 1})
    soft = pod_object("soft", limits={RESOURCE_GPU: 1})
    soft["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
    ]
    every = build_snapshot_extender(_cluster(tmp_path), keep=0)
    assert sorted(_filter(every.service, plain)) == sorted(NODES)
    every.close()
    short = build_snapshot_extender(_cluster(tmp_path), keep=4)
    assert len(_filter(short.service, plain)) == 4
    assert sorted(_filter(short.service, soft)) == sorted(NODES)
    short.close()


def test_rejected_nodes_are_still_reported_when_the_shortlist_applies(tmp_path: Path) -> None:
    extender = build_snapshot_extender(_cluster(tmp_path), keep=2)
    _place(extender.service, "big", 8, "n0")
    pod = pod_object("eight", limits={RESOURCE_GPU: 8})
    result = extender.service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": NODES}), pod)
    assert len(result.NodeNames or []) == 2 and "n0" not in (result.NodeNames or [])
    assert set(result.FailedNodes or {}) == {"n0"}
    extender.close()


def test_shortlist_orders_by_rank_then_fullness_then_a_random_order_fixed_per_pod() -> None:
    names = [f"n{i}" for i in range(8)]
    ranks = [9, 10, 10, 10, 3, 10, 10, 10]
    fullness = [5, 0, 2, 0, 9, 0, 0, 0]
    kept = shortlist(names, ranks, fullness, keep=3, seed="pod-a")
    assert kept[0] == "n2" and len(kept) == 3 and "n0" not in kept and "n4" not in kept
    assert kept == shortlist(names, ranks, fullness, keep=3, seed="pod-a")
    picks = {tuple(shortlist(names, ranks, fullness, keep=3, seed=f"pod-{i}")[1:]) for i in range(20)}
    assert len(picks) > 1  # ties among equals are not always broken the same way
    assert shortlist(names, ranks, fullness, keep=8, seed="x") == names
    assert shortlist(names, ranks, fullness, keep=0, seed="x") == names


@pytest.mark.parametrize(
    ("spec", "weighs"),
    [
        ({}, False),
        ({"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}]}, False),
        ({"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}]}, True),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}, False),
        ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}}, True),
        ({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}}, True),
        ({"affinity": "not a mapping"}, False),
    ],
)
def test_soft_preferences_are_recognised(spec: dict[str, Any], weighs: bool) -> None:
    assert weighs_soft_preferences({"spec": spec}) is weighs


@pytest.mark.parametrize(
    "limits",
    [{RESOURCE_GPU: 1}, {RESOURCE_GPU: 2}, {RESOURCE_GPU: 4}, {RESOURCE_GPU: 8}],
)
def test_on_a_mixed_cluster_the_shortlist_is_never_ranked_below_a_node_left_out(
    tmp_path: Path, limits: dict[str, int]
) -> None:
    """Ranks are computed once per node state (token) in filter; prioritize ranks every node."""
    items: list[dict[str, Any]] = []
    names: list[str] = []
    for i in range(24):
        name, profile = f"m{i:02d}", ("dgx-h100", "l40s-pcie-8", "p4d.24xlarge")[i % 3]
        inventory = profile_inventory(profile, name)
        names.append(name)
        items += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory)]
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(cluster_list(items)))
    extender = build_snapshot_extender(path, keep=5)
    service = extender.service
    for i, node in enumerate(names[:12]):  # varied free states
        _place(service, f"hold-{node}", 1 + i % 4, node)
    pod = pod_object("probe", limits=limits)
    args = parse(ExtenderArgs, {"Pod": pod, "NodeNames": names})
    result = service.filter(args, pod)
    passed = list(result.NodeNames or [])
    fitting = [
        n
        for n in names
        if n not in (result.FailedNodes or {}) and n not in (result.FailedAndUnresolvableNodes or {})
    ]
    hosts, scores = service.prioritize(parse(ExtenderArgs, {"Pod": pod, "NodeNames": fitting}), pod)
    rank = dict(zip(hosts, scores, strict=True))
    assert len(fitting) > 5 and len(passed) == 5
    left_out = set(fitting) - set(passed)
    assert min(rank[n] for n in passed) >= max((rank[n] for n in left_out), default=0)
    extender.close()
