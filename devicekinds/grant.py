"""What a container gets for its devices (env, mounts, device nodes, annotations, CDI names), and
how GPUs are named to the container runtime: the node's device-list strategies.

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

from devicekinds.device import PluginDevice

CDI_KIND_GPU = "nvidia.com/gpu"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/gpuweave_"
ANNOTATION_DEVICES = "gpuweave.io/devices"
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


@dataclass(frozen=True)
class GrantContext:
    """What the node agent knows beyond the devices: its device-list strategies and the MPS
    daemons (one pipe directory for every GPU, or a lookup of each GPU's own daemon)."""

    listing: DeviceListing = DeviceListing()
    mps_pipe_dir: str | MpsPipeLookup | None = None


def cdi_annotation_key(resource: str) -> str:
    """``cdi.k8s.io/gpuweave_<resource>``: one key per resource, so a container's keys never clash."""
    return CDI_ANNOTATION_PREFIX + resource.replace("/", "_")


def listed(
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


def with_devices(
    grant: ContainerGrant, chosen: Sequence[PluginDevice], *, mounts: tuple[HostMount, ...] = ()
) -> ContainerGrant:
    """``grant`` with the ``gpuweave.io/devices`` annotation naming ``chosen`` and ``mounts`` added."""
    annotations = {**grant.annotations, ANNOTATION_DEVICES: ",".join(d.id for d in chosen)}
    return replace(grant, annotations=annotations, mounts=grant.mounts + mounts)


def node_grant(chosen: Sequence[PluginDevice], *, envs: Mapping[str, str] | None = None) -> ContainerGrant:
    """A grant of the devices' own host device nodes (no GPU listing, no CDI name)."""
    return ContainerGrant(
        device_nodes=tuple(DeviceNode(path, path, "rw") for d in chosen for path in d.device_nodes),
        envs=dict(envs or {}),
        annotations={ANNOTATION_DEVICES: ",".join(d.id for d in chosen)},
    )
