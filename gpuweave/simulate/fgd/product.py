"""gpuweave as a user deploys it, for trace experiments: the extender's own service objects.

The benchmark's ``gpuweave`` row and ``gpuweave simulate --trace`` place pods through
``scheduler_ext.serving.service.ExtenderService`` (in-process calls, or HTTP on loopback for the
equivalence test), over a ``GpuNodeInventory`` per trace node, and play kube-scheduler around it:
NodeResourcesFit's filter (CPU, memory) from the cluster arrays, then the extender's filter,
prioritize, the gpuweave-scheduler profile's node total (extender score x weight + MostAllocated,
weights read from manifests/scheduler/scheduler-config.yaml, ``scheduler_profile``), a random
choice among tied totals, and bind, whose recorded assignment names the GPUs taken.

Trace units in the product's units (every trace GPU is offered as a fractional GPU, since the
trace places shares and whole GPUs on the same GPUs):
- a share of m milli-GPU asks ``gpuweave.io/gpu-compute: m / 10`` (1 unit = 1% of a GPU);
- a pod of n whole GPUs has n containers asking ``gpuweave.io/gpu-compute: 100`` each (a
  container's units come from one GPU, so the n containers take n distinct GPUs);
- a GPU-type constraint ``A|B`` is the selector ``productName in ["A", "B"]``;
- CPU and host memory are the pod's ``cpu``/``memory`` requests (NodeResourcesFit's part).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

from devicemodel.contracts import ANNOTATION_GPU_SELECTOR, RESOURCE_GPU_COMPUTE
from devicemodel.errors import GpuweaveError
from devicemodel.inventory import Architecture, Gpu, NodeInventory
from devicemodel.sharing import MILLI_PER_COMPUTE_UNIT
from gpuweave.simulate.cluster import NodeSpec, Request
from gpuweave.simulate.cluster_objects import inventory_object, node_object


class ProductPathError(GpuweaveError):
    """The extender refused a pod kube-scheduler's view says fits, or answered an HTTP error."""


def trace_inventory(node: NodeSpec) -> NodeInventory:
    """A trace node as its node agent would publish it: ``gpus`` GPUs of product ``model``."""
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{zlib.crc32(node.name.encode()):08x}-0000-4000-8000-{i:012x}",
            pci_bus_id=f"00000000:{i + 1:02x}:00.0",
            product=node.model,
            architecture=Architecture.UNKNOWN,
            compute_capability="0.0",
            memory_mib=16_384,
            numa_node=0,
            pcie_switch=None,
            pcie_root="pci0000:00",
            minor=i,
        )
        for i in range(node.gpus)
    )
    return NodeInventory(name=node.name, numa_nodes=1, gpus=gpus)


def objects_for(nodes: Sequence[NodeSpec], inventories: Sequence[NodeInventory]) -> list[dict[str, Any]]:
    """The Node and GpuNodeInventory objects the extender's watches would deliver."""
    items: list[dict[str, Any]] = []
    for node, inventory in zip(nodes, inventories, strict=True):
        sharing = {str(g.index): {"mode": "fractional"} for g in inventory.gpus}
        obj = node_object(node.name, gpus=node.gpus)
        allocatable = obj["status"]["allocatable"] | {
            "cpu": f"{node.cpu_milli}m",
            "memory": f"{node.memory_mib}Mi",
        }
        obj["status"] |= {"allocatable": allocatable, "capacity": dict(allocatable)}
        items += [obj, inventory_object(inventory, sharing=sharing)]
    return items


def pod_for(request: Request, *, uid: str) -> dict[str, Any]:
    """A v1.Pod asking in the product's units for what a trace request asks (module docstring)."""
    host = {"cpu": f"{request.cpu_milli}m", "memory": f"{request.memory_mib}Mi"}
    if request.gpu_count == 0:
        containers = [{"name": "main", "resources": {"requests": host, "limits": host}}]
    else:
        units = request.gpu_milli // MILLI_PER_COMPUTE_UNIT
        containers = [
            {
                "name": f"gpu{i}",
                "resources": {"limits": (host if i == 0 else {}) | {RESOURCE_GPU_COMPUTE: str(units)}},
            }
            for i in range(request.gpu_count)
        ]
    annotations = {}
    if request.gpu_types:
        names = ", ".join(json.dumps(t) for t in request.gpu_types.split("|"))
        annotations[ANNOTATION_GPU_SELECTOR] = f'device.attributes["gpuweave.io"].productName in [{names}]'
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "annotations": annotations},
        "spec": {"schedulerName": "gpuweave-scheduler", "containers": containers},
        "status": {"phase": "Pending"},
    }
