"""Filter's rejected nodes: failed vs unresolvable, reasons per node, and the metrics they feed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.simulate.cluster_objects import pod_object
from scheduler_ext.app import build_snapshot_extender
from scheduler_ext.serving.server import decode_body, encode_filter_result
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, parse
from tests.support.mixed_cluster import mixed_cluster_snapshot


def _args(pod: dict[str, Any], names: list[str]) -> ExtenderArgs:
    return parse(ExtenderArgs, {"Pod": pod, "NodeNames": names})


def test_failed_and_unresolvable_nodes_keep_their_own_reasons_and_counts(tmp_path: Path) -> None:
    extender = build_snapshot_extender(mixed_cluster_snapshot(tmp_path))
    service = extender.service
    holder = pod_object("holder", limits={RESOURCE_GPU: 4})
    service.filter(_args(holder, ["h100-b"]), holder)
    assert service.bind(ExtenderBindingArgs(PodName="holder", PodNamespace="default",
                                            PodUID=holder["metadata"]["uid"], Node="h100-b")) == ""
    pod = pod_object("train", limits={RESOURCE_GPU: 8})
    names = ["cpu-only", "h100-a", "h100-b", "pcie-4"]
    result = service.filter(_args(pod, names), pod)
    assert result.NodeNames == ["h100-a"]
    assert result.FailedNodes == {"h100-b": "pod needs 8 free GPUs; node has 4 free of 8"}
    assert set(result.FailedAndUnresolvableNodes or {}) == {"cpu-only", "pcie-4"}
    assert "no GpuNodeInventory" in (result.FailedAndUnresolvableNodes or {})["cpu-only"]
    assert "needs 8 whole GPUs; node offers 4" in (result.FailedAndUnresolvableNodes or {})["pcie-4"]
    text = extender.metrics.render().decode()
    assert 'gpuweave_extender_decisions_total{outcome="failed",verb="filter"} 3.0' in text
    assert 'gpuweave_extender_rejections_total{reason="no-inventory"} 1.0' in text
    extender.close()


def test_filter_answer_is_json_that_the_standard_decoder_reads_back() -> None:
    result = ExtenderFilterResult.model_construct(
        NodeNames=["a", "nœud-ü"], FailedNodes={"b": 'needs "4" GPUs\n'}, FailedAndUnresolvableNodes={},
        Nodes=None, Error="",
    )
    assert json.loads(encode_filter_result(result)) == {
        "Nodes": None, "NodeNames": ["a", "nœud-ü"], "FailedNodes": {"b": 'needs "4" GPUs\n'},
        "FailedAndUnresolvableNodes": {}, "Error": "",
    }


@pytest.mark.parametrize("body", [b"NaN", b'{"a": Infinity}', b"{not json", b"\xff"])
def test_bodies_that_are_not_strict_json_are_value_errors(body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_body(body)
