"""Allocate: validate the kubelet's device IDs and say how a container gets those devices.

Pure: the caller passes the resource's devices and current health. Rejections raise
``AllocationRejectedError`` with a reason the kubelet shows in the pod's admission error; the gRPC
layer maps it to INVALID_ARGUMENT. A failure concerns only the IDs asked for, never siblings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deviceplugin.devices import DeviceKind, PluginDevice
from deviceplugin.errors import AllocationRejectedError

CDI_KIND_GPU = "nvidia.com/gpu"
ANNOTATION_DEVICES = "gpuweave.io/devices"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"

# GPU UUID -> the pipe directory of that GPU's live MPS daemon (None: no MPS for it); raises
# AllocationRejectedError when the GPU's daemon is down, so no share is granted without one.
MpsPipeLookup = Callable[[str], str | None]


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class HostMount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerGrant:
    """What the kubelet applies to the container: env, mounts, device nodes, annotations, CDI."""

    envs: dict[str, str] = field(default_factory=dict, hash=False)
    mounts: tuple[HostMount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict, hash=False)
    cdi_devices: tuple[str, ...] = ()


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


def _single_gpu(resource: str, chosen: Sequence[PluginDevice]) -> str:
    gpus = sorted({d.gpu_uuid for d in chosen if d.gpu_uuid})
    if len(gpus) != 1:
        raise AllocationRejectedError(
            f"{resource}: {len(chosen)} units span {len(gpus)} GPUs ({', '.join(gpus)}); a container's "
            "share units must all come from one GPU: request fewer units or let the scheduler place the pod"
        )
    return gpus[0]


def _gpu_grant(chosen: Sequence[PluginDevice]) -> ContainerGrant:
    ids = [d.id for d in chosen]
    return ContainerGrant(
        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)},
        annotations={ANNOTATION_DEVICES: ",".join(ids)},
        cdi_devices=tuple(f"{CDI_KIND_GPU}={device_id}" for device_id in ids),
    )


def _efa_grant(resource: str, chosen: Sequence[PluginDevice]) -> ContainerGrant:
    missing = [d.id for d in chosen if not d.device_nodes]
    if missing:
        raise AllocationRejectedError(
            f"{resource}: adapter(s) {', '.join(missing)} have no uverbs device node"
        )
    nodes = tuple(DeviceNode(path, path, "rw") for d in chosen for path in d.device_nodes)
    return ContainerGrant(
        device_nodes=nodes, annotations={ANNOTATION_DEVICES: ",".join(d.id for d in chosen)}
    )


def _share_grant(
    resource: str, chosen: Sequence[PluginDevice], *, mps_pipe_dir: str | MpsPipeLookup | None
) -> ContainerGrant:
    gpu_uuid = _single_gpu(resource, chosen)
    kind = chosen[0].kind
    if callable(mps_pipe_dir) and kind is not DeviceKind.REPLICA:
        mps_pipe_dir = mps_pipe_dir(gpu_uuid)  # this GPU's own daemon, or a rejection
    envs = {"NVIDIA_VISIBLE_DEVICES": gpu_uuid}
    mounts: tuple[HostMount, ...] = ()
    if kind is DeviceKind.COMPUTE:
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(len(chosen))
    elif kind is DeviceKind.MEMORY:
        # One GPU is visible in the container, so it is CUDA device ordinal 0 for the MPS client.
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={len(chosen)}G"
    if isinstance(mps_pipe_dir, str) and mps_pipe_dir and kind is not DeviceKind.REPLICA:
        envs[MPS_PIPE_ENV] = mps_pipe_dir
        mounts = (HostMount(mps_pipe_dir, mps_pipe_dir),)
    return ContainerGrant(
        envs=envs,
        mounts=mounts,
        annotations={ANNOTATION_DEVICES: ",".join(d.id for d in chosen)},
        cdi_devices=(f"{CDI_KIND_GPU}={gpu_uuid}",),
    )


def _replica_grant(chosen: Sequence[PluginDevice]) -> ContainerGrant:
    gpus = sorted({d.gpu_uuid for d in chosen if d.gpu_uuid})
    return ContainerGrant(
        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(gpus)},
        annotations={ANNOTATION_DEVICES: ",".join(d.id for d in chosen)},
        cdi_devices=tuple(f"{CDI_KIND_GPU}={uuid}" for uuid in gpus),
    )


def grant_for(
    resource: str,
    device_ids: Sequence[str],
    *,
    devices: Mapping[str, PluginDevice],
    unhealthy: Mapping[str, str],
    mps_pipe_dir: str | MpsPipeLookup | None = None,
) -> ContainerGrant:
    """Validate one container's request and build its grant.

    ``mps_pipe_dir`` is one directory for every GPU, or a lookup of each GPU's own daemon."""
    chosen = validate_request(resource, device_ids, devices=devices, unhealthy=unhealthy)
    kinds = {d.kind for d in chosen}
    if len(kinds) != 1:
        raise AllocationRejectedError(f"{resource}: request mixes device kinds {sorted(kinds)}")
    kind = kinds.pop()
    if kind in (DeviceKind.GPU, DeviceKind.MIG):
        return _gpu_grant(chosen)
    if kind is DeviceKind.EFA:
        return _efa_grant(resource, chosen)
    if kind is DeviceKind.REPLICA:
        return _replica_grant(chosen)
    return _share_grant(resource, chosen, mps_pipe_dir=mps_pipe_dir)
