"""The objects a node agent publishes: its GpuNodeInventory resource and GFD-style node labels.

Pure builders, shared by the running agent's publisher and ``gpuweave publish``, so the command
prints exactly what the agent writes. The spec is the node's ``NodeProfileSpec`` (camelCase, as
profile files spell it); the status carries per-device health, withheld devices and per-GPU
sharing, which the scheduler extender reads.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from devicemodel.contracts import API_GROUP, API_VERSION, LABEL_PREFLIGHT, NODE_INVENTORY_KIND
from devicemodel.degraded import STATUS_FIELD as DEGRADED_FIELD
from devicemodel.degraded import links_to_wire
from devicemodel.inventory import DegradedLink, NodeInventory
from devicemodel.sharing import SharingMode, SharingPlan
from devicemodel.spec import NodeProfileSpec
from nodeagent.devices import lost_reasons
from topology.network import LABEL_GPU_CLIQUE

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
LABEL_TOPOLOGY = "gpuweave.io/topology"
# Every label key the node agent writes on its Node (``node_labels``' and the one that says it
# answers gang preflights): what manifests/admission-node-agent.yaml lets it change and what
# ``node-agent --cleanup`` removes.
AGENT_LABEL_KEYS = frozenset(
    {
        LABEL_PREFLIGHT,
        LABEL_TOPOLOGY,
        LABEL_GPU_CLIQUE,
        "nvidia.com/gpu.count",
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.memory",
        "nvidia.com/gpu.family",
        "nvidia.com/gpu.compute.major",
        "nvidia.com/gpu.compute.minor",
        "nvidia.com/mig.capable",
        "nvidia.com/mig.strategy",
        *(f"nvidia.com/cuda.driver-version.{p}" for p in ("major", "minor", "revision", "full")),
        *(f"nvidia.com/cuda.driver.{p}" for p in ("major", "minor", "rev")),
        *(f"nvidia.com/cuda.runtime-version.{p}" for p in ("major", "minor", "full")),
    }
)
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """A valid label value: unsafe characters become '-', at most 63, alphanumeric at both ends."""
    return _LABEL_UNSAFE.sub("-", text)[:63].strip("-._")


def topology_shape(inventory: NodeInventory) -> str:
    """A short name of the GPU interconnect: ``nvswitch-8``, ``nvlink-8``, ``pcie-8``, ``none``."""
    count = len(inventory.gpus)
    if not count:
        return "none"
    if inventory.nvswitch and len(inventory.nvswitch.gpus) == count:
        return f"nvswitch-{count}"
    if inventory.nvlinks:
        return f"nvlink-{count}"
    return f"pcie-{count}"


def _version_labels(prefix: str, version: str, parts: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    pieces = version.split(".") if version else []
    for name, piece in zip(parts, pieces, strict=False):
        labels[f"{prefix}.{name}"] = label_value(piece)
    if pieces:
        labels[f"{prefix}.full"] = label_value(version)
    return labels


def node_labels(inventory: NodeInventory) -> dict[str, str]:
    """GPU Feature Discovery compatible labels (``nvidia.com/gpu.*``, ``nvidia.com/cuda.*``, MIG)."""
    labels = {"nvidia.com/gpu.count": str(len(inventory.gpus)), LABEL_TOPOLOGY: topology_shape(inventory)}
    if inventory.gpus:
        product, _ = Counter(g.product for g in inventory.gpus).most_common(1)[0]
        gpu = next(g for g in inventory.gpus if g.product == product)
        major, _, minor = gpu.compute_capability.partition(".")
        labels |= {
            "nvidia.com/gpu.product": label_value(product),
            "nvidia.com/gpu.memory": str(gpu.memory_mib),
            "nvidia.com/gpu.family": label_value(gpu.architecture.value),
            "nvidia.com/gpu.compute.major": label_value(major),
            "nvidia.com/gpu.compute.minor": label_value(minor),
            "nvidia.com/mig.capable": str(any(g.mig_capable for g in inventory.gpus)).lower(),
            "nvidia.com/mig.strategy": "mixed",
        }
    if inventory.nvswitch is not None and inventory.nvswitch.clique is not None:
        labels[LABEL_GPU_CLIQUE] = inventory.nvswitch.clique  # the multi-node NVLink domain, as GFD
    labels |= _version_labels(
        "nvidia.com/cuda.driver-version", inventory.driver_version, ("major", "minor", "revision")
    )
    labels |= _version_labels("nvidia.com/cuda.driver", inventory.driver_version, ("major", "minor", "rev"))
    labels.pop("nvidia.com/cuda.driver.full", None)
    labels |= _version_labels(
        "nvidia.com/cuda.runtime-version", inventory.cuda_driver_version, ("major", "minor")
    )
    return labels


def _device_health(
    inventory: NodeInventory, faults: Mapping[str, str], withheld: Mapping[str, str]
) -> list[dict[str, str]]:
    entries: list[tuple[str, str, str | None]] = [("gpu", g.uuid, None) for g in inventory.gpus]
    entries += [("mig", m.uuid, m.parent_uuid) for m in inventory.mig_devices]
    entries += [("nic", n.name, None) for n in inventory.nics]
    devices = []
    for kind, device_id, parent in entries:
        reason = faults.get(device_id) or (faults.get(parent) if parent else None)
        held = withheld.get(device_id) or (withheld.get(parent) if parent else None)
        health = UNHEALTHY if reason or held else HEALTHY
        entry = {"id": device_id, "kind": kind, "health": health}
        if reason or held:
            entry["reason"] = str(reason or held)
        devices.append(entry)
    devices += [  # GPUs the driver counts but cannot reach: Unhealthy under the ID the kubelet lists
        {"id": device_id, "kind": "gpu", "health": UNHEALTHY, "reason": reason}
        for device_id, reason in lost_reasons(inventory).items()
    ]
    return devices


def inventory_object(
    inventory: NodeInventory,
    *,
    sharing: SharingPlan | None = None,
    faults: Mapping[str, str] | None = None,
    withheld: Mapping[str, str] | None = None,
    degraded: Iterable[DegradedLink] = (),
) -> dict[str, Any]:
    """The cluster-scoped ``GpuNodeInventory`` named after the node; ``degraded``: the NVLink pairs
    the agent's active checks found slow (``status.degradedLinks``, left out when there are none)."""
    plan = sharing or SharingPlan()
    devices = _device_health(inventory, faults or {}, withheld or {})
    shared = {
        g.uuid: {"mode": plan.for_gpu(g).mode.value, "replicas": plan.for_gpu(g).replicas}
        for g in inventory.gpus
        if not g.mig_enabled and plan.for_gpu(g).mode is not SharingMode.EXCLUSIVE
    }
    status: dict[str, Any] = {
        "devices": devices,
        "unhealthyDevices": sorted(d["id"] for d in devices if d["health"] != HEALTHY),
        "withheld": sorted(withheld or {}),
    }
    if shared:
        status["sharing"] = shared
    links = links_to_wire(degraded)
    if links:
        status[DEGRADED_FIELD] = links
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": NODE_INVENTORY_KIND,
        "metadata": {"name": inventory.name, "labels": {LABEL_TOPOLOGY: topology_shape(inventory)}},
        "spec": NodeProfileSpec.from_inventory(inventory).to_wire(),
        "status": status,
    }


def node_label_object(inventory: NodeInventory) -> dict[str, Any]:
    """The Node fields the agent owns (a strategic-merge patch body, shown as a Node)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": inventory.name, "labels": node_labels(inventory)},
    }


def published_list(inventory: NodeInventory, *, sharing: SharingPlan | None = None) -> dict[str, Any]:
    """Everything the agent publishes for a node, as a Kubernetes ``List``."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [inventory_object(inventory, sharing=sharing), node_label_object(inventory)],
    }
