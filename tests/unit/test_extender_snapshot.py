"""Snapshots: the objects the node agent publishes (``gpuweave publish``) plus pods, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from devicemodel.errors import InvalidInputError
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.cli import main
from gpuweave.simulate.cluster_objects import node_object, pod_object, profile_inventory
from nodeagent.published import inventory_object as published_inventory
from nodeagent.published import node_label_object
from scheduler_ext.app import build_core
from scheduler_ext.cluster.snapshot import load_snapshot
from scheduler_ext.pods.requests import pod_request


def _published_yaml(tmp_path: Path) -> tuple[Path, list[str]]:
    inventory = profile_inventory("p5.48xlarge", "gpu-1")
    plan = SharingPlan(per_gpu={"7": GpuSharing(SharingMode.FRACTIONAL)})
    held = [inventory.gpus[0].uuid, inventory.gpus[1].uuid]
    assignment = PodAssignment(
        node="gpu-1", containers={"main": ContainerAssignment(devices={RESOURCE_GPU: held})}
    )
    bound = pod_object("running", limits={RESOURCE_GPU: 2}, node="gpu-1", phase="Running")
    bound["metadata"]["annotations"][ANNOTATION_ASSIGNMENT] = assignment.to_annotation()
    finished = pod_object("done", limits={RESOURCE_GPU: 2}, node="gpu-1", phase="Succeeded")
    finished["metadata"]["annotations"][ANNOTATION_ASSIGNMENT] = PodAssignment(
        node="gpu-1",
        containers={"main": ContainerAssignment(devices={RESOURCE_GPU: [inventory.gpus[2].uuid]})},
    ).to_annotation()
    documents = [
        {"apiVersion": "v1", "kind": "List", "items": [published_inventory(inventory, sharing=plan)]},
        {**node_object("gpu-1", gpus=8), **{"metadata": node_label_object(inventory)["metadata"]}},
        bound,
        finished,
    ]
    path = tmp_path / "published.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path, held


def test_published_objects_and_pods_rebuild_the_holdings(tmp_path: Path) -> None:
    path, held = _published_yaml(tmp_path)
    cache, core = build_core()
    counts = load_snapshot(path, cache)
    assert counts == {"GpuNodeInventory": 1, "Node": 1, "Pod": 2}
    assert cache.synced.is_set()
    state = cache.node("gpu-1")
    assert state is not None and state.layout is not None
    assert set(state.holders) == set(held)  # the Succeeded pod released its GPU
    assert state.layout.gpu_by_index[7].mode is SharingMode.FRACTIONAL
    assert core.decide(pod_request(pod_object("six", limits={RESOURCE_GPU: 5})), state).fits
    assert not core.decide(pod_request(pod_object("seven", limits={RESOURCE_GPU: 6})), state).fits
    assert core.decide(pod_request(pod_object("share", limits={RESOURCE_GPU_COMPUTE: 40})), state).fits


def test_withheld_devices_are_not_offered(tmp_path: Path) -> None:
    inventory = profile_inventory("dgx-a100", "gpu-2")
    published = published_inventory(inventory, withheld={inventory.gpus[3].uuid: "Xid 79"})
    path = tmp_path / "snap.json"
    path.write_text(json.dumps({"kind": "List", "items": [node_object("gpu-2", gpus=8), published]}))
    cache, core = build_core()
    load_snapshot(path, cache)
    verdict = core.decide(pod_request(pod_object("all", limits={RESOURCE_GPU: 8})), cache.node("gpu-2"))
    assert verdict.unresolvable and "withheld as unhealthy" in verdict.reason


NOT_A_LIST = [
    ("- 1\n- 2\n", "holds list \\[1, 2\\], not a Kubernetes List or object"),
    ('{"apiVersion": "v1", "metadata": {}}', "has no kind \\(its keys: 'apiVersion, metadata'\\)"),
    ("", "is empty"),
    ("just text\n", "holds str 'just text'"),
    ('{"kind": "PodList", "metadata": {}}', "is a 'PodList' without an items list"),
    ('{"kind": "List", "items": [{"kind": "List", "items": [7]}]}', "of its List holds int 7"),
    ("kind: List\nitems: []\n---\nreplicas: 3\n", "document 2, is not a Kubernetes List or object"),
    ("kind: ConfigMap\ndata: {a: b}\n", "holds no Node, GpuNodeInventory or Pod \\(it holds 'ConfigMap'\\)"),
]


@pytest.mark.parametrize(("text", "message"), [("{nope", "neither JSON nor YAML"), *NOT_A_LIST])
def test_bad_snapshot_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    """A file that is not a Kubernetes List (or objects) is refused, never read as an empty cluster."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    cache, _ = build_core()
    with pytest.raises(InvalidInputError, match=message):
        load_snapshot(path, cache)


@pytest.mark.parametrize(
    "command", [["status"], ["status", "--json"], ["extender", "--listen", "127.0.0.1:0"]]
)
def test_cli_refuses_a_snapshot_that_is_not_a_list_in_one_line(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("replicas: 3\nimage: {tag: latest}\n")  # a Helm values file, not a snapshot
    assert main([*command, "--snapshot", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "is not a Kubernetes List or object" in lines[0], captured.err
    assert lines[0].startswith(f"gpuweave {command[0]}: snapshot {path}")


def test_bad_inventory_is_skipped_not_fatal(tmp_path: Path) -> None:
    bad = {
        "apiVersion": "gpuweave.io/v1alpha1",
        "kind": "GpuNodeInventory",
        "metadata": {"name": "odd"},
        "spec": {"gpus": "many"},
    }
    path = tmp_path / "snap.json"
    path.write_text(json.dumps({"kind": "List", "items": [node_object("odd"), bad]}))
    cache, core = build_core()
    load_snapshot(path, cache)
    verdict = core.decide(pod_request(pod_object("p", limits={RESOURCE_GPU: 1})), cache.node("odd"))
    assert verdict.unresolvable and "publishes no GpuNodeInventory" in verdict.reason
