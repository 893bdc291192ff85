"""GPU capacity and idle GPU per node kind on the extender's /metrics (the dashboard's allocation)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.simulate.cluster_objects import node_object, pod_object, profile_inventory
from scheduler_ext.app import build_snapshot_extender
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, parse
from tests.support.mixed_cluster import mixed_cluster_snapshot


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["product"], s.labels["gpus_per_node"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_capacity_and_idle_gpus_per_kind_follow_binds(tmp_path: Path) -> None:
    extender = build_snapshot_extender(mixed_cluster_snapshot(tmp_path))
    h100 = profile_inventory("p5.48xlarge", "x").gpus[0].product
    a100 = profile_inventory("a100-pcie-nvbridge-4", "x").gpus[0].product

    before = extender.metrics.render().decode()
    assert _samples(before, "gpuweave_extender_gpus") == {(h100, "8"): 16.0, (a100, "4"): 4.0}
    assert _samples(before, "gpuweave_extender_free_gpus") == {(h100, "8"): 16.0, (a100, "4"): 4.0}

    pod = pod_object("train", limits={RESOURCE_GPU: 3})
    extender.service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": ["h100-a"]}), pod)
    binding = ExtenderBindingArgs(
        PodName="train", PodNamespace="default", PodUID=pod["metadata"]["uid"], Node="h100-a"
    )
    assert extender.service.bind(binding) == ""
    after = extender.metrics.render().decode()
    assert _samples(after, "gpuweave_extender_gpus")[(h100, "8")] == 16.0
    assert _samples(after, "gpuweave_extender_free_gpus") == {(h100, "8"): 13.0, (a100, "4"): 4.0}
    extender.close()


def test_an_inventory_whose_node_is_gone_counts_for_nothing(tmp_path: Path) -> None:
    """A scale-down deletes the Node; its GpuNodeInventory may stay (no owner reference, or before
    the garbage collector runs): its GPUs are not capacity, not free, and not placeable."""
    extender = build_snapshot_extender(mixed_cluster_snapshot(tmp_path))
    h100 = profile_inventory("p5.48xlarge", "x").gpus[0].product
    extender.cache.delete_node("h100-b")
    text = extender.metrics.render().decode()
    assert _samples(text, "gpuweave_extender_gpus")[(h100, "8")] == 8.0
    assert _samples(text, "gpuweave_extender_free_gpus")[(h100, "8")] == 8.0
    assert "h100-b" not in extender.cache.node_names() and extender.cache.node("h100-b") is None
    pod = pod_object("train", limits={RESOURCE_GPU: 8})
    filtered = extender.service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": ["h100-b"]}), pod)
    assert filtered.NodeNames == []
    extender.cache.upsert_node(node_object("h100-b", gpus=8))  # a Node of that name again: it counts
    assert _samples(extender.metrics.render().decode(), "gpuweave_extender_gpus")[(h100, "8")] == 16.0
    extender.close()
