"""Allocate: validate the kubelet's device IDs and say how a container gets those devices.

Pure: the caller passes the resource's devices and current health. Rejections raise
``AllocationRejectedError`` with a reason the kubelet shows in the pod's admission error; the gRPC
layer maps it to INVALID_ARGUMENT. A failure concerns only the IDs asked for, never siblings.

What a container gets is its resource kind's answer (``devicekinds``: the kind that made the
devices, looked up in the registry). How the GPUs are named to the container runtime is the
node's device-list strategy (``devicekinds.grant``: ``envvar``, ``volume-mounts``,
``cdi-annotations``, ``cdi-cri``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from devicekinds.efa import CDI_KIND_EFA
from devicekinds.grant import (
    ANNOTATION_DEVICES,
    CDI_ANNOTATION_PREFIX,
    CDI_KIND_GPU,
    DEFAULT_STRATEGIES,
    VISIBLE_DEVICES_ENV,
    VOLUME_MOUNT_ROOT,
    ContainerGrant,
    DeviceListing,
    DeviceListStrategy,
    DeviceNode,
    GrantContext,
    HostMount,
    MpsPipeLookup,
    cdi_annotation_key,
    parse_strategies,
)
from devicekinds.registry import KINDS, KindRegistry
from devicekinds.shares import MPS_PIPE_ENV
from nodeagent.devices import PluginDevice
from nodeagent.errors import AllocationRejectedError


def validate_request(
    resource: str,
    device_ids: Sequence[str],
    *,
    devices: Mapping[str, PluginDevice],
    unhealthy: Mapping[str, str],
) -> list[PluginDevice]:
    """The requested devices, or ``AllocationRejectedError`` naming the first bad ID and why."""
    if not device_ids:
        raise AllocationRejectedError(f"{resource}: empty allocation request: name at least one device ID")
    seen: set[str] = set()
    chosen: list[PluginDevice] = []
    for device_id in device_ids:
        if device_id in seen:
            raise AllocationRejectedError(
                f"{resource}: device {device_id!r} requested twice in one container"
            )
        seen.add(device_id)
        device = devices.get(device_id)
        if device is None:
            raise AllocationRejectedError(
                f"{resource}: unknown device {device_id!r}; this node offers {len(devices)} devices of it"
            )
        if device_id in unhealthy:
            raise AllocationRejectedError(
                f"{resource}: device {device_id} is unhealthy ({unhealthy[device_id]})"
            )
        chosen.append(device)
    return chosen


def grant_for(
    resource: str,
    device_ids: Sequence[str],
    *,
    devices: Mapping[str, PluginDevice],
    unhealthy: Mapping[str, str],
    mps_pipe_dir: str | MpsPipeLookup | None = None,
    listing: DeviceListing | None = None,
    kinds: KindRegistry = KINDS,
) -> ContainerGrant:
    """Validate one container's request and build its grant.

    ``mps_pipe_dir`` is one directory for every GPU, or a lookup of each GPU's own daemon;
    ``listing`` the node's device-list strategies (default: ``envvar`` and ``cdi-cri``)."""
    listing = listing or DeviceListing()
    chosen = validate_request(resource, device_ids, devices=devices, unhealthy=unhealthy)
    kinds_of = {d.kind for d in chosen}
    if len(kinds_of) != 1:
        raise AllocationRejectedError(f"{resource}: request mixes device kinds {sorted(kinds_of)}")
    kind = kinds_of.pop()
    maker = kinds.kind_of(chosen[0])
    if maker is None:
        raise AllocationRejectedError(f"{resource}: no resource kind serves devices of kind {kind!r}")
    return maker.grant(resource, chosen, GrantContext(listing=listing, mps_pipe_dir=mps_pipe_dir))


__all__ = [
    "ANNOTATION_DEVICES",
    "CDI_ANNOTATION_PREFIX",
    "CDI_KIND_EFA",
    "CDI_KIND_GPU",
    "DEFAULT_STRATEGIES",
    "MPS_PIPE_ENV",
    "VISIBLE_DEVICES_ENV",
    "VOLUME_MOUNT_ROOT",
    "ContainerGrant",
    "DeviceListStrategy",
    "DeviceListing",
    "DeviceNode",
    "HostMount",
    "MpsPipeLookup",
    "cdi_annotation_key",
    "parse_strategies",
]
