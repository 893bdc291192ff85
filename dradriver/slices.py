"""ResourceSlices (``resource.k8s.io/v1``) for one node's pool, from its ``DraDevice`` values.

Pure: devices, taints and a generation in, slice objects out (``validate.check_slices`` checks
them against the API server's limits before anything is sent). One pool per node, named after the
node, driver ``gpuweave.io``; every slice of the pool carries the same generation and the pool's
slice count. The API server allows devices or shared counters in a slice, never both, at most 8
counter sets per slice and at most 64 devices per slice once any device consumes counters or
carries taints, so the pool is cut as:

- ``<node>-gpuweave.io-counters-<k>``: the counter sets of up to 8 partitionable GPUs;
- ``<node>-gpuweave.io-<k>``: up to 64 devices each, in ``dra_devices`` order (a GPU and its MIG
  placements stay together where they fit).

A node with no device still publishes one empty slice, so the pool says "nothing here" rather
than looking incomplete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan
from dradriver.devices import (
    DRIVER,
    DraDevice,
    MigPublishing,
    counter_set_name,
    dra_devices,
    gpu_counters,
)
from dradriver.share_units import share_counter_set_name, share_counters
from dradriver.shares import with_shares
from dradriver.taint import Taint
from dradriver.validate import check_slices

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MAX_DEVICES_PER_SLICE = 64  # the limit once any device consumes counters or has taints
MAX_COUNTER_SETS_PER_SLICE = 8
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuweave-node-agent"
_MAX_NAME = 253


def slice_name(node: str, suffix: str) -> str:
    """``<node>-gpuweave.io-<suffix>``, the node part cut so the name stays within 253 characters."""
    tail = f"-{DRIVER}-{suffix}"
    return node[: _MAX_NAME - len(tail)].rstrip("-.") + tail


def _quantity(value: int | str) -> dict[str, str]:
    return {"value": str(value)}


def device_wire(device: DraDevice, taints: Sequence[Taint] = ()) -> dict[str, Any]:
    """One ``Device`` of a slice: name, attributes, capacity (with its request policy on a device
    several claims share), counter consumption, taints."""
    wire: dict[str, Any] = {"name": device.name, "attributes": dict(device.attributes)}
    if device.capacity:
        wire["capacity"] = {name: _quantity(value) for name, value in device.capacity.items()}
        for name, policy in device.request_policy.items():
            wire["capacity"][name]["requestPolicy"] = dict(policy)
    if device.allow_multiple:
        wire["allowMultipleAllocations"] = True
    if device.consumes and device.gpu_uuid:
        wire["consumesCounters"] = [
            {
                "counterSet": device.counter_set or "",
                "counters": {name: _quantity(amount) for name, amount in device.consumes.items()},
            }
        ]
    if taints:
        wire["taints"] = [t.to_wire() for t in taints]
    return wire


def counter_sets(inventory: NodeInventory, devices: Iterable[DraDevice]) -> list[dict[str, Any]]:
    """The counter sets of every GPU some device consumes from, by GPU index: its MIG slices, or a
    fractional GPU's compute and memory units."""
    used = {d.counter_set for d in devices if d.consumes}
    sets = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        for name, counters in (
            (counter_set_name(gpu), gpu_counters(gpu)),  # MIG slices (--dra-mig dynamic)
            (share_counter_set_name(gpu), share_counters(gpu)),  # a fractional GPU's units
        ):
            if counters is not None and name in used:
                sets.append(
                    {"name": name, "counters": {k: _quantity(value) for k, value in counters.items()}}
                )
    return sets


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def build_resource_slices(
    inventory: NodeInventory,
    devices: Sequence[DraDevice],
    *,
    generation: int = 1,
    taints: Mapping[str, Sequence[Taint]] | None = None,
    owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every ResourceSlice of the node's pool. ``taints``: device name -> its taints; ``owner``: an
    ownerReference (the Node) so the slices go when the Node goes."""
    node = inventory.name
    taints = taints or {}
    counter_chunks = _chunks(counter_sets(inventory, devices), MAX_COUNTER_SETS_PER_SLICE)
    device_chunks = _chunks([device_wire(d, taints.get(d.name, ())) for d in devices], MAX_DEVICES_PER_SLICE)
    device_chunks = device_chunks or [[]]
    count = len(counter_chunks) + len(device_chunks)
    specs: list[tuple[str, dict[str, Any]]] = [
        (slice_name(node, f"counters-{k}"), {"sharedCounters": list(chunk)})
        for k, chunk in enumerate(counter_chunks)
    ]
    specs += [(slice_name(node, str(k)), {"devices": list(chunk)}) for k, chunk in enumerate(device_chunks)]
    slices = []
    for name, body in specs:
        metadata: dict[str, Any] = {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
        if owner:
            metadata["ownerReferences"] = [dict(owner)]
        spec: dict[str, Any] = {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **body,
        }
        slices.append({"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec})
    return slices


def pool_slices(
    inventory: NodeInventory,
    *,
    mig: MigPublishing = MigPublishing.STATIC,
    generation: int = 1,
    taints: Mapping[str, Sequence[Taint]] | None = None,
    owner: Mapping[str, Any] | None = None,
    sharing: SharingPlan | None = None,
) -> list[dict[str, Any]]:
    """The node's pool as the agent publishes it (``sharing``: its fractional GPUs as shared
    devices, ``dradriver.shares``), checked against the API server's limits."""
    devices = dra_devices(inventory, mig=mig)
    if sharing is not None:
        devices = with_shares(devices, inventory, sharing)
    slices = build_resource_slices(inventory, devices, generation=generation, taints=taints, owner=owner)
    check_slices(slices)
    return slices
