"""Allocate: validate the kubelet's device IDs and say how a container gets those devices.

Pure: the caller passes the resource's devices and current health. Rejections raise
``AllocationRejectedError`` with a reason the kubelet shows in the pod's admission error; the gRPC
layer maps it to INVALID_ARGUMENT. A failure concerns only the IDs asked for, never siblings.

How the GPUs are named to the container runtime is the node's device-list strategy (one or more,
``DeviceListing``), because runtimes differ in what they honour:

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<ids>`` for the NVIDIA Container Toolkit's hook (legacy mode).
- ``volume-mounts``: ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` and one ``/dev/null``
  mount per device under it; the toolkit reads the list from the mounts when it is set to ignore
  the variable for unprivileged pods (Bottlerocket's default), so an image's own
  ``NVIDIA_VISIBLE_DEVICES=all`` cannot widen it.
- ``cdi-annotations``: a ``cdi.k8s.io/gpuweave_<resource>`` annotation listing CDI names.
- ``cdi-cri``: CDI names in the Allocate answer's ``cdi_devices`` (kubelet 1.28+), resolved by
  containerd or CRI-O against the specs ``nodeagent.cdi`` writes.

Without ``envvar`` or ``volume-mounts`` the variable is set to ``void`` so an image's default never
makes the toolkit's hook inject every GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from devicemodel.contracts import IMEX_CHANNELS_ENV
from nodeagent.devices import DeviceKind, PluginDevice
from nodeagent.errors import AllocationRejectedError

CDI_KIND_GPU = "nvidia.com/gpu"
CDI_KIND_EFA = "vpc.amazonaws.com/efa"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/gpuweave_"
ANNOTATION_DEVICES = "gpuweave.io/devices"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"


class DeviceListStrategy(StrEnum):
    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"


DEFAULT_STRATEGIES = frozenset({DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI})


@dataclass(frozen=True)
class DeviceListing:
    """How Allocate names devices to the runtime (the strategies above), and the node's
    ``rdma_cm`` node, handed with every EFA adapter where the host has one."""

    strategies: frozenset[DeviceListStrategy] = DEFAULT_STRATEGIES
    rdma_cm: str | None = None

    @property
    def uses_cdi(self) -> bool:
        return bool(self.strategies & {DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI})


def parse_strategies(text: str) -> frozenset[DeviceListStrategy]:
    """``envvar,cdi-cri`` -> the strategies; a ``ValueError`` naming the bad word and the choices."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    known = {s.value: s for s in DeviceListStrategy}
    bad = [w for w in words if w not in known]
    if bad or not words:
        raise ValueError(
            f"device-list strategy {text!r}: unknown {', '.join(bad) or '(empty)'}; "
            f"choose one or more of {', '.join(known)} separated by commas"
        )
    return frozenset(known[w] for w in words)


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


def _listed(
    resource: str, ids: Sequence[str], *, listing: DeviceListing, envs: Mapping[str, str] | None = None
) -> ContainerGrant:
    """The GPU part of a grant: ``ids`` (GPU or MIG UUIDs) named to the runtime by each strategy."""
    strategies = listing.strategies
    names = tuple(f"{CDI_KIND_GPU}={device_id}" for device_id in ids)
    merged = dict(envs or {})
    mounts: tuple[HostMount, ...] = ()
    annotations: dict[str, str] = {}
    if DeviceListStrategy.VOLUME_MOUNTS in strategies:
        merged[VISIBLE_DEVICES_ENV] = VOLUME_MOUNT_ROOT
        mounts = tuple(HostMount(f"{VOLUME_MOUNT_ROOT}/{i}", "/dev/null", read_only=True) for i in ids)
    elif DeviceListStrategy.ENVVAR in strategies:
        merged[VISIBLE_DEVICES_ENV] = ",".join(ids)
    else:
        merged[VISIBLE_DEVICES_ENV] = "void"  # an image's NVIDIA_VISIBLE_DEVICES=all must not apply
    if DeviceListStrategy.CDI_ANNOTATIONS in strategies:
        annotations[cdi_annotation_key(resource)] = ",".join(names)
    cdi = names if DeviceListStrategy.CDI_CRI in strategies else ()
    return ContainerGrant(envs=merged, mounts=mounts, annotations=annotations, cdi_devices=cdi)


def cdi_annotation_key(resource: str) -> str:
    """``cdi.k8s.io/gpuweave_<resource>``: one key per resource, so a container's keys never clash."""
    return CDI_ANNOTATION_PREFIX + resource.replace("/", "_")


def _with(
    grant: ContainerGrant, chosen: Sequence[PluginDevice], *, mounts: tuple[HostMount, ...] = ()
) -> ContainerGrant:
    annotations = {**grant.annotations, ANNOTATION_DEVICES: ",".join(d.id for d in chosen)}
    return replace(grant, annotations=annotations, mounts=grant.mounts + mounts)


def _gpu_grant(resource: str, chosen: Sequence[PluginDevice], *, listing: DeviceListing) -> ContainerGrant:
    return _with(_listed(resource, [d.id for d in chosen], listing=listing), chosen)


def _efa_grant(resource: str, chosen: Sequence[PluginDevice], *, listing: DeviceListing) -> ContainerGrant:
    missing = [d.id for d in chosen if not d.device_nodes]
    if missing:
        raise AllocationRejectedError(
            f"{resource}: adapter(s) {', '.join(missing)} have no uverbs device node"
        )
    paths = [path for d in chosen for path in d.device_nodes]
    if listing.rdma_cm:  # libfabric's EFA provider opens the RDMA connection manager too
        paths.append(listing.rdma_cm)
    names = tuple(f"{CDI_KIND_EFA}={d.id}" for d in chosen)
    annotations = {ANNOTATION_DEVICES: ",".join(d.id for d in chosen)}
    if DeviceListStrategy.CDI_ANNOTATIONS in listing.strategies:
        annotations[cdi_annotation_key(resource)] = ",".join(names)
    return ContainerGrant(
        device_nodes=tuple(DeviceNode(path, path, "rw") for path in paths),
        annotations=annotations,
        cdi_devices=names if DeviceListStrategy.CDI_CRI in listing.strategies else (),
    )


def _share_grant(
    resource: str,
    chosen: Sequence[PluginDevice],
    *,
    mps_pipe_dir: str | MpsPipeLookup | None,
    listing: DeviceListing,
) -> ContainerGrant:
    gpu_uuid = _single_gpu(resource, chosen)
    kind = chosen[0].kind
    if callable(mps_pipe_dir) and kind is not DeviceKind.REPLICA:
        mps_pipe_dir = mps_pipe_dir(gpu_uuid)  # this GPU's own daemon, or a rejection
    envs: dict[str, str] = {}
    mounts: tuple[HostMount, ...] = ()
    if kind is DeviceKind.COMPUTE:
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(len(chosen))
    elif kind is DeviceKind.MEMORY:
        # One GPU is visible in the container, so it is CUDA device ordinal 0 for the MPS client.
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={len(chosen)}G"
    if isinstance(mps_pipe_dir, str) and mps_pipe_dir and kind is not DeviceKind.REPLICA:
        envs[MPS_PIPE_ENV] = mps_pipe_dir
        mounts = (HostMount(mps_pipe_dir, mps_pipe_dir),)
    return _with(_listed(resource, [gpu_uuid], listing=listing, envs=envs), chosen, mounts=mounts)


def _imex_grant(chosen: Sequence[PluginDevice]) -> ContainerGrant:
    """The channel's device node and ``NVIDIA_IMEX_CHANNELS``, which the NVIDIA Container
    Toolkit reads to make the same channel visible; no CDI name (the node goes in as a DeviceSpec,
    which every runtime honours)."""
    return ContainerGrant(
        device_nodes=tuple(DeviceNode(path, path, "rw") for d in chosen for path in d.device_nodes),
        envs={IMEX_CHANNELS_ENV: ",".join(str(d.unit) for d in chosen)},
        annotations={ANNOTATION_DEVICES: ",".join(d.id for d in chosen)},
    )


def _replica_grant(
    resource: str, chosen: Sequence[PluginDevice], *, listing: DeviceListing
) -> ContainerGrant:
    gpus = sorted({d.gpu_uuid for d in chosen if d.gpu_uuid})
    return _with(_listed(resource, gpus, listing=listing), chosen)


def grant_for(
    resource: str,
    device_ids: Sequence[str],
    *,
    devices: Mapping[str, PluginDevice],
    unhealthy: Mapping[str, str],
    mps_pipe_dir: str | MpsPipeLookup | None = None,
    listing: DeviceListing | None = None,
) -> ContainerGrant:
    """Validate one container's request and build its grant.

    ``mps_pipe_dir`` is one directory for every GPU, or a lookup of each GPU's own daemon;
    ``listing`` the node's device-list strategies (default: ``envvar`` and ``cdi-cri``)."""
    listing = listing or DeviceListing()
    chosen = validate_request(resource, device_ids, devices=devices, unhealthy=unhealthy)
    kinds = {d.kind for d in chosen}
    if len(kinds) != 1:
        raise AllocationRejectedError(f"{resource}: request mixes device kinds {sorted(kinds)}")
    kind = kinds.pop()
    if kind in (DeviceKind.GPU, DeviceKind.MIG):
        return _gpu_grant(resource, chosen, listing=listing)
    if kind is DeviceKind.EFA:
        return _efa_grant(resource, chosen, listing=listing)
    if kind is DeviceKind.REPLICA:
        return _replica_grant(resource, chosen, listing=listing)
    if kind is DeviceKind.IMEX:
        return _imex_grant(chosen)
    return _share_grant(resource, chosen, mps_pipe_dir=mps_pipe_dir, listing=listing)
