"""Checks a pool's ResourceSlices against the limits kube-apiserver enforces for ``resource.k8s.io/v1``.

Run before anything is printed or sent, so a device model that the API server would refuse is
reported here, naming the slice, the device and the limit, instead of as a 422 on every publish.
The limits are those of ``k8s.io/api/resource/v1`` (types.go) in Kubernetes 1.37.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from devicemodel.errors import GpuweaveError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_ATTRIBUTES_AND_CAPACITY = 32
MAX_STRING_VALUE = 64
MAX_TAINTS = 16
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


class ResourceSliceError(GpuweaveError):
    """A ResourceSlice the API server would refuse."""


def _fail(slice_name: str, what: str) -> ResourceSliceError:
    return ResourceSliceError(f"ResourceSlice {slice_name}: {what}; fix the device model before publishing")


def _check_device(slice_name: str, device: Mapping[str, Any], counters: Mapping[str, set[str]]) -> None:
    name = str(device.get("name", ""))
    if not DNS_LABEL.match(name):
        raise _fail(slice_name, f"device name {name!r} is not a DNS label")
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITY:
        raise _fail(
            slice_name,
            f"device {name} has {len(attributes)} attributes and {len(capacity)} capacities, "
            f"more than {MAX_ATTRIBUTES_AND_CAPACITY} together",
        )
    for key, value in attributes.items():
        if not isinstance(value, dict) or len(value) != 1:
            raise _fail(slice_name, f"device {name} attribute {key} must hold exactly one typed value")
        text = value.get("string")
        if isinstance(text, str) and len(text) > MAX_STRING_VALUE:
            raise _fail(slice_name, f"device {name} attribute {key} is {len(text)} characters (max 64)")
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS or any(t.get("effect") not in TAINT_EFFECTS for t in taints):
        raise _fail(slice_name, f"device {name}: at most {MAX_TAINTS} taints with effect in {TAINT_EFFECTS}")
    consumptions = device.get("consumesCounters") or []
    if len(consumptions) > MAX_CONSUMPTIONS_PER_DEVICE:
        raise _fail(slice_name, f"device {name} consumes from {len(consumptions)} counter sets (max 2)")
    for consumption in consumptions:
        known = counters.get(consumption.get("counterSet", ""))
        if known is None:
            raise _fail(
                slice_name, f"device {name} consumes unknown counter set {consumption.get('counterSet')!r}"
            )
        unknown = sorted(set(consumption.get("counters") or {}) - known)
        if unknown:
            raise _fail(
                slice_name, f"device {name} consumes counters {unknown} its counter set does not define"
            )


def _pool_counters(slices: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    counters: dict[str, set[str]] = {}
    for item in slices:
        name = item["metadata"]["name"]
        sets = item["spec"].get("sharedCounters") or []
        if sets and item["spec"].get("devices"):
            raise _fail(name, "holds both devices and sharedCounters (only one is allowed)")
        if len(sets) > 8:
            raise _fail(name, f"{len(sets)} counter sets (max 8)")
        for counter_set in sets:
            if counter_set["name"] in counters or not DNS_LABEL.match(counter_set["name"]):
                raise _fail(name, f"counter set {counter_set['name']!r} repeated or not a DNS label")
            if len(counter_set.get("counters") or {}) > MAX_COUNTERS_PER_SET:
                raise _fail(
                    name, f"counter set {counter_set['name']} has more than {MAX_COUNTERS_PER_SET} counters"
                )
            counters[counter_set["name"]] = set(counter_set.get("counters") or {})
    return counters


def check_slices(slices: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``ResourceSliceError`` for the first limit a pool's slices break."""
    counters = _pool_counters(slices)
    seen: set[str] = set()
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"]) for s in slices}
    if len(pools) > 1:
        raise ResourceSliceError(
            f"ResourceSlices of one pool disagree on pool or generation: {sorted(pools)}"
        )
    for item in slices:
        name, spec = item["metadata"]["name"], item["spec"]
        if spec["pool"]["resourceSliceCount"] != len(slices):
            raise _fail(
                name, f"resourceSliceCount {spec['pool']['resourceSliceCount']} but {len(slices)} slices"
            )
        devices = spec.get("devices") or []
        advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
        limit = 64 if advanced else 128
        if len(devices) > limit:
            raise _fail(name, f"{len(devices)} devices (max {limit})")
        for device in devices:
            _check_device(name, device, counters)
            if device["name"] in seen:
                raise _fail(name, f"device name {device['name']} appears twice in the pool")
            seen.add(device["name"])
