"""A client of the kubelet's pod-resources API v1: which pod holds which device, as the kubelet sees it.

The kubelet's device manager is the truth about allocations: a device it handed to a pod stays the
pod's until the pod ends, whether or not a container has started, and whether or not the extender
placed the pod. The kubelet serves this on ``/var/lib/kubelet/pod-resources/kubelet.sock``
(``v1.PodResourcesLister``); ``list_devices`` asks ``List`` once and maps every device ID to the
pod and container holding it.

The client fails loudly: a missing socket, a refused connection, a timeout or any gRPC error raises
``PodResourcesUnavailableError`` naming the socket and what to check. It never answers "nothing in
use" when it could not ask, so callers choose what "unknown" means (the MIG manager refuses to
reshape; health eviction retries next round).

One channel per call: calls are rare (a reshape, a remediation round), and a fresh channel follows
the socket when the kubelet restarts and re-creates it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from devicemodel.assignment import parent_gpu_of_share
from nodeagent.errors import DevicePluginError
from proto.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a node with hundreds of pods and devices lists well under this
POD_RESOURCES_DIR = "pod-resources"
POD_RESOURCES_SOCKET = "kubelet.sock"
DEVICE_PLUGINS_DIR = "device-plugins"
# Grants this recent count as held even when pod-resources does not list them yet: the kubelet
# records a container's devices right after our Allocate answer, so seconds cover the gap.
ALLOCATE_GRACE_S = 10.0


class PodResourcesUnavailableError(DevicePluginError):
    """The kubelet's pod-resources API could not be asked: allocations are unknown, not empty."""


@dataclass(frozen=True)
class PodRef:
    """The pod (and container) the kubelet gave a device to."""

    namespace: str
    name: str
    container: str
    resource: str


@dataclass(frozen=True)
class ContainerDevices:
    """One container's devices as the kubelet lists them (``PodResourcesClient.containers``)."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]  # device-plugin IDs, and DRA devices as the IDs they stand for
    claim_devices: tuple[tuple[str, str, str], ...] = ()  # (claim namespace, claim name, device) of ours


def default_socket_for(kubelet_dir: Path) -> Path | None:
    """``<kubelet root>/pod-resources/kubelet.sock`` when ``kubelet_dir`` is the kubelet's
    ``.../device-plugins`` directory (as ``/var/lib/kubelet/device-plugins`` is); else None: a
    device-plugin directory of another shape gives no kubelet root to find the API under."""
    if kubelet_dir.name != DEVICE_PLUGINS_DIR:
        return None
    return kubelet_dir.parent / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET


# (driver, pool, device name) of a DRA claim's device -> the device ID it stands for, or None
DraResolver = Callable[[str, str, str], str | None]


class PodResourcesClient:
    """Asks the kubelet which devices pods hold; every call has a deadline of ``timeout`` seconds.

    In DRA mode (``resolve_dra_with``) the devices of pods' ResourceClaims count too: the kubelet
    lists them as a container's ``dynamic_resources``, named by driver, pool and device name, and the
    resolver turns ours back into device IDs (GPU or MIG UUID, adapter name), so the MIG manager's
    busy check and health's eviction see DRA pods as they see device-plugin pods."""

    def __init__(self, socket_path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout <= 0:
            raise ValueError(f"pod-resources timeout must be positive, got {timeout}")
        self.socket_path = socket_path
        self.timeout = timeout
        self._dra: DraResolver | None = None

    def resolve_dra_with(self, resolver: DraResolver) -> None:
        self._dra = resolver

    def list_devices(self) -> dict[str, PodRef]:
        """Every device ID the kubelet has allocated, mapped to its pod; raises when it cannot tell."""
        response = self._list()
        held: dict[str, PodRef] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    ref = PodRef(pod.namespace, pod.name, container.name, devices.resource_name)
                    for device_id in devices.device_ids:
                        held[device_id] = ref
                held |= self._claimed(pod.namespace, pod.name, container)
        return held

    def _claimed(self, namespace: str, name: str, container: api_pb2.ContainerResources) -> dict[str, PodRef]:
        """The container's DRA devices that the resolver knows, by device ID."""
        held: dict[str, PodRef] = {}
        if self._dra is None:
            return held
        for claim in container.dynamic_resources:
            ref = PodRef(namespace, name, container.name, f"claim {claim.claim_namespace}/{claim.claim_name}")
            for resource in claim.claim_resources:
                device_id = self._dra(resource.driver_name, resource.pool_name, resource.device_name)
                if device_id:
                    held[device_id] = ref
        return held

    def containers(self) -> list[ContainerDevices]:
        """Every container the kubelet admitted, with its device IDs (DRA devices the resolver
        knows included) and its claims' devices; raises when it cannot tell."""
        found: list[ContainerDevices] = []
        for pod in self._list().pod_resources:
            for container in pod.containers:
                ids = [i for devices in container.devices for i in devices.device_ids]
                ids += list(self._claimed(pod.namespace, pod.name, container))
                claimed = tuple(
                    (claim.claim_namespace, claim.claim_name, resource.device_name)
                    for claim in container.dynamic_resources
                    for resource in claim.claim_resources
                    if self._dra is not None
                    and self._dra(resource.driver_name, resource.pool_name, resource.device_name)
                )
                found.append(ContainerDevices(pod.namespace, pod.name, container.name, tuple(ids), claimed))
        return found

    def pod_devices(self) -> dict[tuple[str, str], frozenset[str]]:
        """(namespace, name) -> the device IDs of all the pod's containers; raises when it cannot tell."""
        grouped: dict[tuple[str, str], set[str]] = {}
        for device_id, ref in self.list_devices().items():
            grouped.setdefault((ref.namespace, ref.name), set()).add(device_id)
        return {key: frozenset(ids) for key, ids in grouped.items()}

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        if not self.socket_path.exists():
            raise self._unavailable("the socket does not exist")
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path}", options=options) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                return stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "error"
            raise self._unavailable(f"List failed: {name} {details}") from exc

    def _unavailable(self, what: str) -> PodResourcesUnavailableError:
        return PodResourcesUnavailableError(
            f"kubelet pod-resources API at {self.socket_path}: {what} (deadline {self.timeout:g} s); "
            "which pods hold which devices is unknown. Check that the kubelet runs and that the "
            "agent mounts the kubelet's pod-resources directory, or set --pod-resources-socket"
        )


class AllocationLog:
    """The device IDs this agent handed out in Allocate since it started, with when.

    A second source next to pod-resources: the kubelet records a container's devices (and lists
    them in pod-resources) only after our Allocate answer returns, so a device granted a moment
    ago may not be listed yet. The device-plugin API has no "deallocate", so an entry says the
    device was given, not that it is still held: callers look at a recent window.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._granted_at: dict[str, float] = {}

    def record(self, device_ids: Iterable[str]) -> None:
        now = self._clock()
        with self._lock:
            for device_id in device_ids:
                self._granted_at[device_id] = now

    def device_ids(self, *, within_s: float | None = None) -> frozenset[str]:
        """Every ID granted since start, or only those granted in the last ``within_s`` seconds."""
        with self._lock:
            if within_s is None:
                return frozenset(self._granted_at)
            since = self._clock() - within_s
            return frozenset(d for d, at in self._granted_at.items() if at >= since)


class HeldDevices:
    """Device IDs pods hold now, for the MIG manager's busy check: what the kubelet lists in
    pod-resources, plus what this agent granted in the last ``grace_s`` seconds. A share ID
    (``<uuid>::compute-3``) also names its GPU or MIG device, which a reshape must keep.

    Without a client (no pod-resources socket configured) only the recent grants count. With one,
    an unreachable API raises ``PodResourcesUnavailableError``: the caller treats every device as busy.
    """

    def __init__(
        self,
        client: PodResourcesClient | None,
        allocations: AllocationLog,
        *,
        grace_s: float = ALLOCATE_GRACE_S,
    ) -> None:
        self._client = client
        self._allocations = allocations
        self._grace_s = grace_s

    def __call__(self) -> frozenset[str]:
        held = set(self._allocations.device_ids(within_s=self._grace_s))
        if self._client is not None:
            held |= self._client.list_devices().keys()
        parents = {parent_gpu_of_share(d) for d in held}
        return frozenset(held | {p for p in parents if p is not None})
