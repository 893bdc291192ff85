"""GPU nodes as API objects (no kubelet) for the tests that end at the binding: the Node (labels,
a taint only the test's pods tolerate, Ready status with capacity) and the GpuNodeInventory the
node agent would publish for it; and what the bound pods' assignment annotations hold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan
from nodeagent.published import inventory_object
from tests.e2e.cluster import ControlPlane

INVENTORIES = ("gpuweave.io", "v1alpha1", "gpunodeinventories")


def create_gpu_node(
    plane: ControlPlane,
    inventory: NodeInventory,
    *,
    labels: Mapping[str, str],
    taint: Mapping[str, str],
    resources: Mapping[str, str],
    message: str = "e2e GPU node",
    sharing: SharingPlan | None = None,
) -> None:
    """The Node ``inventory.name`` and its GpuNodeInventory (spec, then status as the agent writes it)."""
    name = inventory.name
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"taints": [dict(taint)]},
    }
    plane.core.create_node(body)
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": message}
    status = {"capacity": dict(resources), "allocatable": dict(resources), "conditions": [ready]}
    plane.core.patch_node_status(name, {"status": status})
    publish_inventory(plane, inventory, create=True, sharing=sharing)


def publish_inventory(
    plane: ControlPlane,
    inventory: NodeInventory,
    *,
    faults: dict[str, str] | None = None,
    create: bool = False,
    sharing: SharingPlan | None = None,
) -> None:
    """The GpuNodeInventory as the node agent publishes it: created, and its status (device health,
    per-GPU sharing)."""
    body = inventory_object(inventory, faults=faults, sharing=sharing)
    custom = client.CustomObjectsApi(plane.api)
    if create:
        custom.create_cluster_custom_object(*INVENTORIES, {k: v for k, v in body.items() if k != "status"})
    custom.patch_cluster_custom_object_status(*INVENTORIES, inventory.name, {"status": body["status"]})


def held_devices(plane: ControlPlane, namespace: str) -> dict[str, list[str]]:
    """node/device -> the pods in ``namespace`` whose assignment annotation names it."""
    held: dict[str, list[str]] = {}
    for pod in plane.core.list_namespaced_pod(namespace).items:
        raw = (pod.metadata.annotations or {}).get(ANNOTATION_ASSIGNMENT)
        if raw:
            assignment = PodAssignment.from_annotation(raw)
            for device in assignment.all_device_ids():
                held.setdefault(f"{assignment.node}/{device}", []).append(pod.metadata.name)
    return held
