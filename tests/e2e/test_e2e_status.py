"""`gpuweave status` and `--explain` against the real control plane, and the extender's pod Events.

The module runs its own node (a real node agent on the kubelet's device manager), tainted as the
fault nodes are, so its injected Xid and its pods never reach another test's node.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane, SimNode, gpuweave_command, wait_for
from tests.e2e.pods import (
    FAULT_TAINT,
    GPU,
    assigned_devices,
    gpu_indices,
    gpu_pod,
    scheduling_failure,
    wait_admitted,
)

pytestmark = pytest.mark.e2e

STATUS_NODE = "e2e-status"
PROFILE = "dgx-a100"
INVENTORY = ("gpuweave.io", "v1alpha1", "gpunodeinventories")
V100_ONLY = 'device.attributes["gpuweave.io"].productName == "Tesla V100-SXM2-32GB"'


@pytest.fixture(scope="module")
def status_node(
    plane: ControlPlane, cluster: dict[str, SimNode], agent_kubeconfig: Any
) -> Iterator[SimNode]:
    """A dgx-a100 node created tainted (the harness node adopts the existing Node object), so
    no other test's pod lands there; removed with its inventory afterwards."""
    labels = {"kubernetes.io/hostname": STATUS_NODE, "kubernetes.io/os": "linux"}
    plane.core.create_node(
        {"metadata": {"name": STATUS_NODE, "labels": labels}, "spec": {"taints": [FAULT_TAINT]}}
    )
    node = SimNode(plane, name=STATUS_NODE, profile=PROFILE, agent_kubeconfig=agent_kubeconfig,
                   health_config=plane.work / "health.yaml")
    try:
        node.wait_resource(GPU, allocatable=8, timeout=90)
        yield node
    finally:
        node.stop()
        custom = client.CustomObjectsApi(plane.api)
        for delete in (
            lambda: plane.core.delete_node(STATUS_NODE),
            lambda: custom.delete_cluster_custom_object(*INVENTORY, STATUS_NODE),
        ):
            try:
                delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise


def status(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*gpuweave_command(), "status", "--kubeconfig", str(plane.admin_kubeconfig), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def status_json(plane: ControlPlane, *args: str) -> dict[str, Any]:
    done = status(plane, *args, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def gpu_row(document: dict[str, Any], index: int) -> dict[str, Any]:
    (node,) = [n for n in document["nodes"] if n["name"] == STATUS_NODE]
    return dict(next(g for g in node["gpus"] if g["index"] == index))


def events_of(plane: ControlPlane, namespace: str, pod: str, reason: str) -> list[Any]:
    listed = plane.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [e for e in listed.items if e.reason == reason]


@pytest.fixture(scope="module")
def placed(plane: ControlPlane, status_node: SimNode, workload_namespace: str) -> dict[str, list[int]]:
    """Two pods on the status node, then Xid 79 on a GPU neither holds (with a process on it, so
    its reset waits and it stays withheld while the tests read it); GPU indices by pod."""
    held: dict[str, list[int]] = {}
    for name, count in (("st-pair", 2), ("st-one", 1)):
        plane.core.create_namespaced_pod(workload_namespace, gpu_pod(name, count, only_on=STATUS_NODE))
        pod, _ = wait_admitted(plane, workload_namespace, name)
        held[name] = sorted(gpu_indices(plane, STATUS_NODE, assigned_devices(pod)[GPU]))
    free = min(set(range(8)) - {i for gpus in held.values() for i in gpus})
    status_node.inject("--gpu", str(free), "--busy", "4242")  # a process on it: the reset waits, it stays out
    status_node.inject("--gpu", str(free), "--xid", "79")
    status_node.wait_resource(GPU, allocatable=7)
    held["xid"] = [free]
    return held


def test_status_lists_pods_per_gpu_and_the_gpu_an_xid_withheld(
    plane: ControlPlane, placed: dict[str, list[int]], workload_namespace: str
) -> None:
    (failed,) = placed["xid"]
    document = wait_for(
        "gpuweave status to show the failed GPU",
        lambda: d if gpu_row(d := status_json(plane), failed)["health"] != "healthy" else None,
    )
    row = gpu_row(document, failed)
    assert row["health"] == "failed" and "Xid 79" in row["reason"] and row["free"] == "-", row
    for pod in ("st-pair", "st-one"):
        for index in placed[pod]:
            row = gpu_row(document, index)
            assert row["holders"] == [{"pod": f"{workload_namespace}/{pod}", "holds": "whole"}], row
    (node,) = [n for n in document["nodes"] if n["name"] == STATUS_NODE]
    assert node["freeGpus"] == 8 - 3 - 1 and node["pods"] == 2
    names = {n["name"] for n in document["nodes"]}
    assert {"e2e-l40s", "e2e-v100", "e2e-h100", "e2e-a100", "e2e-numa", STATUS_NODE} <= names
    text = status(plane, "--node", STATUS_NODE)
    assert text.returncode == 0, text.stderr
    assert max(len(line) for line in text.stdout.splitlines()) <= 80, text.stdout
    assert f"{workload_namespace}/st-pair" in text.stdout and f"NODE {STATUS_NODE}" in text.stdout
    print(text.stdout)  # docs/operations.md shows this screen


def test_explain_gives_the_reasons_for_a_pod_that_cannot_fit_and_its_event(
    plane: ControlPlane, placed: dict[str, list[int]], workload_namespace: str
) -> None:
    """A V100-only selector on the A100 node: kube-scheduler's plugins pass it, the extender does not."""
    pod = gpu_pod("st-v100", 1, only_on=STATUS_NODE)
    pod["metadata"]["annotations"]["gpuweave.io/gpu-selector"] = V100_ONLY
    plane.core.create_namespaced_pod(workload_namespace, pod)
    said = wait_for(
        "st-v100 to be unschedulable", lambda: scheduling_failure(plane, workload_namespace, "st-v100")
    )
    answer = status_json(plane, "--explain", f"{workload_namespace}/st-v100")
    reasons = {r["reason"]: r["nodes"] for r in answer["reasons"]}
    mismatch = next(r for r in reasons if r.startswith("no GPU on the node matches the gpu-selector"))
    assert reasons[mismatch] == 1 and "A100" in mismatch
    assert reasons["node(s) didn't match Pod's node affinity/selector"] == answer["total"] - 1
    assert answer["available"] == [] and answer["schedulerSaid"] == said
    pending = wait_for(  # the pod in status' pending list, with kube-scheduler's FailedScheduling text
        "st-v100 among the pending pods",
        lambda: [p for p in status_json(plane)["pending"] if p["pod"] == f"{workload_namespace}/st-v100"],
    )
    assert pending[0]["asks"].startswith("1 GPU, gpu-selector") and pending[0]["reason"] == said
    screen = status(plane).stdout
    assert "PENDING (" in screen and max(len(line) for line in screen.splitlines()) <= 80
    print(screen[screen.index("PENDING (") :])  # docs/operations.md shows this list
    nodes = status_json(plane)["nodes"]
    v100_free = sum(n["freeGpus"] for n in nodes if n["gpus"][0]["product"].startswith("Tesla V100"))
    assert any("kube-scheduler filters out would fit" in h for h in answer["hints"]) == (v100_free > 0)
    text = status(plane, "--explain", f"{workload_namespace}/st-v100")
    assert max(len(line) for line in text.stdout.splitlines()) <= 80, text.stdout
    print(text.stdout)  # docs/operations.md shows this answer
    (event,) = wait_for(
        "the extender's Event on st-v100",
        lambda: events_of(plane, workload_namespace, "st-v100", "GpuweaveUnschedulable") or None,
    )
    print(f"Event {event.type} {event.reason}: {event.message}")
    assert event.type == "Warning" and event.source.component == "gpuweave-extender"
    assert event.message == f"0/1 nodes are available: 1 node(s): {mismatch}."
    plane.core.delete_namespaced_pod("st-v100", workload_namespace, grace_period_seconds=0)


def test_explain_gives_the_placement_of_a_pod_that_fit_and_its_event(
    plane: ControlPlane, placed: dict[str, list[int]], workload_namespace: str
) -> None:
    answer = status_json(plane, "--explain", f"{workload_namespace}/st-pair")
    pair = placed["st-pair"]
    assert answer["node"] == STATUS_NODE
    assert [d["text"] for d in answer["devices"]] == [f"GPUs {pair[0]},{pair[1]}"]
    assert answer["topology"]["gpus"] == pair and answer["topology"]["allNvlink"] is True
    ranked = {r["node"]: r for r in answer["ranking"]}
    assert ranked[STATUS_NODE]["fits"], ranked[STATUS_NODE]  # its own GPUs counted free
    assert not ranked["e2e-l40s"]["fits"] and "selector" in ranked["e2e-l40s"]["reason"]  # nodeSelector
    text = status(plane, "--explain", f"{workload_namespace}/st-pair")
    assert max(len(line) for line in text.stdout.splitlines()) <= 80, text.stdout
    print(text.stdout)
    (event,) = wait_for(
        "the extender's bind Event on st-pair",
        lambda: events_of(plane, workload_namespace, "st-pair", "GpuweaveAssigned") or None,
    )
    print(f"Event {event.type} {event.reason}: {event.message}")
    assert event.type == "Normal"
    assert event.message.startswith(f"node {STATUS_NODE}: GPUs {pair[0]},{pair[1]} (all pairs NVLink")
