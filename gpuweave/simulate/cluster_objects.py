"""Kubernetes objects for sample clusters: Nodes, GpuNodeInventory objects and Pods as dicts.

The benchmark, the tests and what-if runs build snapshots from built-in node profiles with these,
in the shapes kube-scheduler and the API server use (a pod is a full v1.Pod).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from devicemodel.contracts import API_GROUP, API_VERSION, NODE_INVENTORY_KIND, RESOURCE_GPU
from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfileSpec
from hardware.profiles import load_profile


def node_object(name: str, *, gpus: int = 0, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    allocatable = {"cpu": "96", "memory": "1024Gi", "pods": "110"}
    if gpus:
        allocatable[RESOURCE_GPU] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-node-{name}", "labels": dict(labels or {})},
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def inventory_object(
    inventory: NodeInventory,
    *,
    unhealthy: tuple[str, ...] = (),
    sharing: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"unhealthyDevices": list(unhealthy)}
    if sharing:
        status["sharing"] = {k: dict(v) for k, v in sharing.items()}
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": NODE_INVENTORY_KIND,
        "metadata": {"name": inventory.name},
        "spec": NodeProfileSpec.from_inventory(inventory).to_wire(),
        "status": status,
    }


def profile_inventory(profile: str, node_name: str, *, uuid_salt: str | None = None) -> NodeInventory:
    """A built-in profile's inventory for one node, with node-unique device UUIDs."""
    inventory = load_profile(profile).to_inventory(node_name=node_name)
    return unique_uuids(inventory, salt=uuid_salt or node_name)


def unique_uuids(inventory: NodeInventory, *, salt: str) -> NodeInventory:
    """The same inventory with the last UUID group of every GPU and MIG device derived from ``salt``."""
    tag = hashlib.sha256(salt.encode()).hexdigest()[:12]
    gpus = tuple(replace(g, uuid=_salted(g.uuid, tag)) for g in inventory.gpus)
    uuid_map = {old.uuid: new.uuid for old, new in zip(inventory.gpus, gpus, strict=True)}
    migs = tuple(
        replace(m, uuid=_salted(m.uuid, tag), parent_uuid=uuid_map.get(m.parent_uuid, m.parent_uuid))
        for m in inventory.mig_devices
    )
    return replace(inventory, gpus=gpus, mig_devices=migs)


def _salted(uuid: str, tag: str) -> str:
    return f"{uuid.rsplit('-', 1)[0]}-{tag}"


def pod_object(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    limits: Mapping[str, int | str] | None = None,
    annotations: Mapping[str, str] | None = None,
    init_limits: Mapping[str, int | str] | None = None,
    node: str | None = None,
    priority: int = 0,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A v1.Pod as kube-scheduler serializes it (defaults filled the way the API server fills them)."""
    containers = [_container("main", limits or {})]
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "schedulerName": "gpuweave-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "priority": priority,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if init_limits:
        spec["initContainers"] = [_container("init", init_limits)]
    if node:
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": name},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase, "qosClass": "Burstable"},
    }


def _container(name: str, limits: Mapping[str, int | str]) -> dict[str, Any]:
    resource_limits = {"cpu": "1", "memory": "1Gi", **{k: str(v) for k, v in limits.items()}}
    return {
        "name": name,
        "image": "registry.example/train:1",
        "resources": {"limits": resource_limits, "requests": dict(resource_limits)},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def cluster_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
