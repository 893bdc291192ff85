"""GPU pods for the e2e tests and what to read back from them: the device manager's allocation,
the extender's assignment, and GPU indices from the node's published GpuNodeInventory."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.cluster import ControlPlane, wait_for

FAULT_NODE = "e2e-h100"
HANDOFF_NODE = "e2e-a100"
NUMA_NODE = "e2e-numa"  # kubelet topology manager policy best-effort
GPU = "nvidia.com/gpu"
SCHEDULER_NAME = "gpuweave-scheduler"
FAULT_TAINT = {"key": "e2e.gpuweave.io/fault-tests", "value": "only", "effect": "NoSchedule"}


def gpu_pod(
    name: str,
    gpus: int,
    *,
    resource: str = GPU,
    grace_s: int = 30,
    fault_node: bool = False,
    placement: str | None = None,
    only_on: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "terminationGracePeriodSeconds": grace_s,
        "containers": [{"name": "main", "image": "e2e/none", "resources": {"limits": {resource: str(gpus)}}}],
    }
    if fault_node:
        only_on = FAULT_NODE
    if only_on:
        spec["tolerations"] = [{**FAULT_TAINT, "operator": "Equal"}]
        spec["nodeSelector"] = {"kubernetes.io/hostname": only_on}
    annotations = {"gpuweave.io/placement": placement} if placement else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


def wait_admitted(plane: ControlPlane, namespace: str, name: str) -> tuple[Any, dict[str, Any]]:
    """The pod once the device manager admitted it, and the allocation it recorded."""

    def admitted() -> tuple[Any, dict[str, Any]] | None:
        pod = plane.core.read_namespaced_pod(name, namespace)
        allocation = plane.allocation_of(namespace, name)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed admission: {pod.status.reason}: {pod.status.message}")
        return (pod, allocation) if allocation else None

    return wait_for(f"pod {namespace}/{name} admitted with devices", admitted, timeout=90)


def assigned_devices(pod: Any) -> dict[str, list[str]]:
    """The extender's choice (gpuweave.io/assignment) for the pod's only container."""
    annotation = (pod.metadata.annotations or {}).get("gpuweave.io/assignment")
    assert annotation, f"pod {pod.metadata.name} has no gpuweave.io/assignment annotation"
    containers = json.loads(annotation)["containers"]
    return {resource: sorted(ids) for resource, ids in containers["main"]["devices"].items()}


def inventory(plane: ControlPlane, node: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(plane.api)
    return dict(custom.get_cluster_custom_object("gpuweave.io", "v1alpha1", "gpunodeinventories", node))


def gpu_indices(plane: ControlPlane, node: str, uuids: list[str]) -> set[int]:
    by_uuid = {g["uuid"]: int(g["index"]) for g in inventory(plane, node)["spec"]["gpus"]}
    return {by_uuid[u] for u in uuids}


def gpu_field(plane: ControlPlane, node: str, uuids: list[str], field: str) -> set[Any]:
    """One profile field (pcieSwitch, numaNode, ...) of the given GPUs, as published."""
    by_uuid = {g["uuid"]: g.get(field) for g in inventory(plane, node)["spec"]["gpus"]}
    return {by_uuid[u] for u in uuids}


def allocated_gpus(allocation: dict[str, Any]) -> list[str]:
    return list(allocation["containers"]["main"]["devices"][GPU])


def scheduling_failure(plane: ControlPlane, namespace: str, name: str) -> str | None:
    """The PodScheduled=False message kube-scheduler wrote, once it gave up on this attempt (not
    the API server's ``SchedulingGated``, written while the pod waits for its gates)."""
    pod = plane.core.read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        if condition.reason == "SchedulingGated":
            continue
        if condition.type == "PodScheduled" and condition.status == "False" and condition.message:
            return str(condition.message)
    return None


def nvlinked_pairs(plane: ControlPlane, node: str) -> set[frozenset[int]]:
    return {frozenset(link["gpus"]) for link in inventory(plane, node)["spec"].get("nvlinks", [])}
