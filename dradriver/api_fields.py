"""Which ResourceSlice fields the API server keeps, learned from what it stored, and a pool that
needs only those.

A kube-apiserver whose feature gate of a DRA field is off drops that field from a ResourceSlice on
write, without an error or a warning. Kubernetes 1.34 and 1.35 have all three gates below off by
default (1.36 turns them on), so a pool written there loses its shared counters (MIG placements
and a fractional GPU's units would no longer exclude each other), its device taints (an unhealthy
GPU would look healthy) and the shared device's ``allowMultipleAllocations`` (one claim would take
a whole fractional GPU). The agent does not guess from the server's version, since a cluster may
turn a gate on early: it compares each slice it wrote with the slice the API server returned
(``dropped_features``), logs one line per feature it finds missing, and from then on publishes a
pool that needs none of them (``served_devices``): no MIG placements (MIG as ``--dra-mig static``
publishes it), no fractional GPUs, and no tainted devices (an unhealthy GPU is left out of the
pool instead of being tainted). Pure: slices and devices in, decisions out.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from dradriver.devices import DraDevice, DraKind
from dradriver.taint import Taint

log = logging.getLogger(__name__)


class SliceFeature(StrEnum):
    """A ResourceSlice feature, named by the kube-apiserver feature gate that keeps its fields."""

    PARTITIONABLE = "DRAPartitionableDevices"  # sharedCounters, devices[].consumesCounters
    TAINTS = "DRADeviceTaints"  # devices[].taints
    CONSUMABLE = "DRAConsumableCapacity"  # devices[].allowMultipleAllocations, capacity requestPolicy


DEGRADED = {
    SliceFeature.PARTITIONABLE: "MIG placements and fractional GPUs (shared devices, units) are not "
    "published; a MIG-capable GPU is published whole",
    SliceFeature.TAINTS: "a device with a health or closing taint is left out of the pool instead",
    SliceFeature.CONSUMABLE: "fractional GPUs are not published through DRA",
}


def _carriers(feature: SliceFeature, spec: Mapping[str, Any]) -> set[str]:
    """Where ``spec`` carries fields of ``feature``: device names, ``""`` for the slice itself."""
    found = {""} if feature is SliceFeature.PARTITIONABLE and spec.get("sharedCounters") else set()
    for device in spec.get("devices") or []:
        if feature is SliceFeature.PARTITIONABLE:
            carries = bool(device.get("consumesCounters"))
        elif feature is SliceFeature.TAINTS:
            carries = bool(device.get("taints"))
        else:
            policies = any("requestPolicy" in q for q in (device.get("capacity") or {}).values())
            carries = bool(device.get("allowMultipleAllocations")) or policies
        if carries:
            found.add(str(device.get("name")))
    return found


def dropped_features(
    sent: Sequence[Mapping[str, Any]], stored: Sequence[Mapping[str, Any]]
) -> frozenset[SliceFeature]:
    """The features whose fields a sent slice had and the same slice, as stored, lacks."""
    stored_by_name = {s["metadata"]["name"]: s["spec"] for s in stored}
    dropped = set()
    for item in sent:
        kept = stored_by_name.get(item["metadata"]["name"])
        if kept is None:
            continue
        for feature in SliceFeature:
            if _carriers(feature, item["spec"]) - _carriers(feature, kept):
                dropped.add(feature)
    return frozenset(dropped)


def without_fields(spec: Mapping[str, Any], features: Iterable[SliceFeature]) -> dict[str, Any]:
    """``spec`` without the fields of ``features``: the slice as such an API server stores it."""
    features = frozenset(features)
    out = dict(spec)
    if SliceFeature.PARTITIONABLE in features:
        out.pop("sharedCounters", None)
    devices = []
    for device in spec.get("devices") or []:
        wire = dict(device)
        if SliceFeature.PARTITIONABLE in features:
            wire.pop("consumesCounters", None)
        if SliceFeature.TAINTS in features:
            wire.pop("taints", None)
        if SliceFeature.CONSUMABLE in features:
            wire.pop("allowMultipleAllocations", None)
            if wire.get("capacity"):
                wire["capacity"] = {
                    k: {f: v for f, v in q.items() if f != "requestPolicy"}
                    for k, q in wire["capacity"].items()
                }
        devices.append(wire)
    if "devices" in spec:
        out["devices"] = devices
    return out


def served_devices(
    devices: Sequence[DraDevice],
    taints: Mapping[str, tuple[Taint, ...]],
    unsupported: frozenset[SliceFeature],
) -> tuple[tuple[DraDevice, ...], dict[str, tuple[Taint, ...]]]:
    """The pool's devices and taints reduced to what an API server without ``unsupported`` keeps
    correct (see the module docstring)."""
    kept: list[DraDevice] = []
    for device in devices:
        if SliceFeature.TAINTS in unsupported and taints.get(device.name):
            continue
        if SliceFeature.CONSUMABLE in unsupported and device.allow_multiple:
            continue
        if SliceFeature.PARTITIONABLE in unsupported and device.consumes:
            if device.kind is not DraKind.GPU:
                continue  # a MIG placement, a fractional GPU's unit or shared device
            kept.append(dataclasses.replace(device, consumes={}, counter_set=None))  # the whole GPU
            continue
        kept.append(device)
    if SliceFeature.TAINTS in unsupported:
        return tuple(kept), {}
    return tuple(kept), dict(taints)


class ServedFields:
    """What this process learned about the API server's slices; shared by the publisher (which
    learns) and the pool builder (which reads ``unsupported``). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsupported: frozenset[SliceFeature] = frozenset()

    @property
    def unsupported(self) -> frozenset[SliceFeature]:
        with self._lock:
            return self._unsupported

    def learn(
        self, sent: Sequence[Mapping[str, Any]], stored: Sequence[Mapping[str, Any]]
    ) -> frozenset[SliceFeature]:
        """Compare a write with its answer; log and return the features newly found dropped."""
        dropped = dropped_features(sent, stored)
        with self._lock:
            new = dropped - self._unsupported
            self._unsupported |= new
        for feature in sorted(new):
            log.warning(
                "the API server dropped the ResourceSlice fields of %s (feature gate %s off: the default "
                "before Kubernetes 1.36); %s",
                feature.name.lower(),
                feature.value,
                DEGRADED[feature],
            )
        return frozenset(new)
