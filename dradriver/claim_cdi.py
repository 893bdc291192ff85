"""CDI specs for prepared DRA claims: one spec file per claim, built from the device plugin's edits.

A claim's devices get the same container edits Allocate gives a container
(``nodeagent.cdi.build_specs``: ``/dev/nvidia<minor>`` per GPU, the parent's node plus the
``nvidia-caps`` access nodes per MIG device, ``uverbsN`` per EFA adapter; ``nvidiactl``,
``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset`` and ``rdma_cm`` as common edits) and the
same ``NVIDIA_VISIBLE_DEVICES`` (the claim's GPU and MIG UUIDs, for the NVIDIA Container Toolkit's
hook). The node's IMEX channel gets what Allocate gives ``gpuweave.io/imex-channel``: its device
node (``/dev/nvidia-caps-imex-channels/channel<N>``, path only: the runtime reads its type and
numbers from the host's node, as it does for the device plugin's DeviceSpec) and
``NVIDIA_IMEX_CHANNELS=<N>``, both as that device's own edits, so only the containers that use its
request see them. A share of a fractional GPU (``dradriver.shares``) gets its GPU's device node and,
as its own edits, the MPS pipe directory (mounted) and the share's limits in the environment.
The spec's kind is ``gpuweave.io/claim`` and each device is named
``<claim-uid>-<device>``, so the kubelet hands the runtime ``gpuweave.io/claim=<claim-uid>-gpu-0``
and two claims never share a name. The files are ``gpuweave.io-claim_<uid>.json`` in the agent's
CDI directory: not matched by the device-plugin writer's ``gpuweave-*`` files, so neither writer
removes the other's.

``claim_spec`` is pure; ``ClaimSpecWriter`` writes and removes the files atomically.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devicekinds.grant import GrantContext
from devicekinds.registry import KINDS
from devicemodel.contracts import IMEX_CHANNELS_ENV
from devicemodel.inventory import NodeInventory
from devicemodel.state_file import replace_file_atomically
from dradriver.devices import DraDevice, DraKind
from hardware.device_nodes import HostDeviceNodes
from nodeagent.allocation import VISIBLE_DEVICES_ENV
from nodeagent.cdi import CDI_VERSION, build_specs
from nodeagent.devices import DeviceKind, PluginDevice

CLAIM_KIND = "gpuweave.io/claim"
CLAIM_FILE_PREFIX = "gpuweave.io-claim_"


def claim_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{CLAIM_KIND}={claim_device_name(claim_uid, device)}"


def claim_file_name(claim_uid: str) -> str:
    return f"{CLAIM_FILE_PREFIX}{claim_uid}.json"


def imex_edits(device: PluginDevice) -> dict[str, Any]:
    """An IMEX channel's container edits: its device node and ``NVIDIA_IMEX_CHANNELS``."""
    return {
        "deviceNodes": [
            {"path": path, "hostPath": path, "permissions": "rw"} for path in device.device_nodes
        ],
        "env": [f"{IMEX_CHANNELS_ENV}={device.unit}"],
    }


def kind_edits(device: PluginDevice) -> dict[str, Any] | None:
    """A generically planned kind's device (``dradriver.devices``, ``DraKind.KIND``): the edits of
    what its kind's Allocate would hand a container for it alone (env, device nodes, mounts)."""
    kind = KINDS.kind_of(device)
    if kind is None:
        return None
    grant = kind.grant(device.resource, [device], GrantContext())
    edits: dict[str, Any] = {}
    if grant.envs:
        edits["env"] = [f"{key}={value}" for key, value in sorted(grant.envs.items())]
    if grant.device_nodes:
        edits["deviceNodes"] = [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}
            for n in grant.device_nodes
        ]
    if grant.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in grant.mounts
        ]
    return edits


def _with_extra(edits: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """A device's edits plus its own extra ones (a GPU share's MPS environment and mount)."""
    merged = dict(edits)
    for key, values in (extra or {}).items():
        merged[key] = [*merged.get(key, []), *values]
    return merged


def _visible_uuid(device: DraDevice) -> str | None:
    """The GPU or MIG UUID the container sees for a device of the claim (None: not a GPU)."""
    plugin = device.plugin
    if plugin is None:
        return None
    if device.kind in (DraKind.GPU_SHARE, DraKind.GPU_COMPUTE, DraKind.GPU_MEMORY):
        return device.gpu_uuid
    return plugin.id if plugin.kind in (DeviceKind.GPU, DeviceKind.MIG) else None


def claim_spec(
    claim_uid: str,
    inventory: NodeInventory,
    devices: Sequence[DraDevice],
    *,
    host: HostDeviceNodes,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    unit_groups: Mapping[str, tuple[str, Mapping[str, Any]]] | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The claim's CDI spec and the problems found (a MIG device without ``nvidia-caps`` minors,
    an EFA adapter without device numbers), which the caller reports. ``extra``: device name ->
    more edits of that device (``env``, ``mounts``: a GPU share's, ``dradriver.shares``);
    ``unit_groups``: CDI device name -> (its GPU's UUID, its edits), one per request of a
    fractional GPU's units (``dradriver.share_units``), which get no device of their own."""
    extra = extra or {}
    served = [d.plugin for d in devices if d.plugin is not None]
    built = build_specs(inventory, served, host=host)
    edits: dict[str, dict[str, Any]] = {}
    common: list[dict[str, Any]] = []
    for file_spec in built.files.values():
        edits |= {str(entry["name"]): entry["containerEdits"] for entry in file_spec["devices"]}
        common += file_spec.get("containerEdits", {}).get("deviceNodes", [])
    edits |= {d.id: imex_edits(d) for d in served if d.kind is DeviceKind.IMEX}
    kinds = {
        d.plugin.id: found
        for d in devices
        if d.kind is DraKind.KIND and d.plugin and (found := kind_edits(d.plugin))
    }
    edits |= kinds
    visible = list(dict.fromkeys(uuid for d in devices if (uuid := _visible_uuid(d)) is not None))
    spec_devices = [
        {
            "name": claim_device_name(claim_uid, d.name),
            "containerEdits": _with_extra(edits[d.plugin.id], extra.get(d.name)),
        }
        for d in devices
        if d.plugin is not None and d.plugin.id in edits
    ]
    spec_devices += [
        {"name": claim_device_name(claim_uid, name), "containerEdits": _with_extra(edits[gpu], more)}
        for name, (gpu, more) in (unit_groups or {}).items()
    ]
    container_edits: dict[str, Any] = {"deviceNodes": common} if common else {}
    if visible:
        container_edits["env"] = [f"{VISIBLE_DEVICES_ENV}={','.join(visible)}"]
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CLAIM_KIND, "devices": spec_devices}
    if container_edits:
        spec["containerEdits"] = container_edits
    return spec, built.problems


class ClaimSpecWriter:
    """Writes and removes claim spec files in ``spec_dir``."""

    def __init__(self, spec_dir: Path) -> None:
        self.spec_dir = Path(spec_dir)

    def write(self, claim_uid: str, spec: dict[str, Any]) -> None:
        self.spec_dir.mkdir(parents=True, exist_ok=True)
        payload = (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
        replace_file_atomically(self.spec_dir / claim_file_name(claim_uid), payload)

    def remove(self, claim_uid: str) -> None:
        (self.spec_dir / claim_file_name(claim_uid)).unlink(missing_ok=True)

    def claim_uids(self) -> set[str]:
        """The claims whose spec files are on disk."""
        if not self.spec_dir.is_dir():
            return set()
        return {
            p.name[len(CLAIM_FILE_PREFIX) : -len(".json")]
            for p in self.spec_dir.glob(f"{CLAIM_FILE_PREFIX}*.json")
        }

    def exists(self, claim_uid: str) -> bool:
        return (self.spec_dir / claim_file_name(claim_uid)).is_file()

    def remove_all_but(self, keep: Iterable[str]) -> list[str]:
        """Remove the spec files of claims not in ``keep`` (left by a run that crashed between
        writing a spec and checkpointing it); return their UIDs."""
        stale = sorted(self.claim_uids() - set(keep))
        for uid in stale:
            self.remove(uid)
        return stale
