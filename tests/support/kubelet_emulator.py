"""A kubelet device-manager emulator for transport tests.

It behaves as the kubelet's device manager does (kubelet ``pkg/kubelet/cm/devicemanager``):

- ``start()`` deletes every unix socket in the plugin directory (``CleanupPluginDirectory``) and
  serves ``v1beta1.Registration`` on a new ``kubelet.sock``;
- ``Register`` checks the version, the extended resource name and the endpoint, dials the plugin
  (10 s), calls ``GetDevicePluginOptions`` (which must match the registration's options) and
  starts consuming ``ListAndWatch``; a re-registration replaces the resource's endpoint;
- ``allocate()`` follows ``devicesToAllocate``: available = healthy - allocated, a Topology
  Manager NUMA hint splits it into aligned / unaligned / no-affinity sets, GetPreferredAllocation
  is asked as the kubelet asks it (only when the plugin offers it), then ``Allocate``;
- ``stop()`` ends every stream and removes ``kubelet.sock``; ``restart()`` is stop + start.

Used by the device plugin's transport tests and by anyone who needs a kubelet on a unix socket.
"""

from __future__ import annotations

import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from proto.v1beta1 import api_pb2, api_pb2_grpc

SUPPORTED_VERSIONS = ("v1beta1",)
HEALTHY = "Healthy"
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_extended_resource_name(name: str) -> bool:
    """``IsExtendedResourceName``: ``domain/name``, not in the kubernetes.io namespace."""
    domain, sep, rest = name.partition("/")
    if not sep or not _DOMAIN.match(domain) or not _NAME.match(rest) or len(domain) > 253:
        return False
    return domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


@dataclass
class SeenDevice:
    id: str
    health: str
    numa_nodes: tuple[int, ...]


@dataclass
class Endpoint:
    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    options: api_pb2.DevicePluginOptions
    devices: dict[str, SeenDevice] = field(default_factory=dict)
    updates: int = 0
    stream: Any = None  # the ListAndWatch call: iterable and cancellable
    thread: threading.Thread | None = None
    ended: bool = False


class AllocationFailedError(Exception):
    """The emulated kubelet refused an allocation (as the real one fails admission)."""


class KubeletEmulator(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.socket_path = plugin_dir / "kubelet.sock"
        self._cond = threading.Condition()
        self._endpoints: dict[str, Endpoint] = {}
        self._allocated: dict[str, set[str]] = {}
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.registrations: list[str] = []
        self.rejections: list[str] = []

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for path in self.plugin_dir.iterdir():
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        self._executor = ThreadPoolExecutor(max_workers=4)
        server = grpc.server(self._executor)
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        with self._cond:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for endpoint in endpoints:
            self._close(endpoint)
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.socket_path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _close(self, endpoint: Endpoint) -> None:
        if endpoint.stream is not None:
            endpoint.stream.cancel()
        if endpoint.thread is not None:
            endpoint.thread.join(timeout=10)
        endpoint.channel.close()

    # ---- Registration service --------------------------------------------------------------
    def Register(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        problem = self._registration_problem(request)
        if problem:
            self.rejections.append(problem)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        channel = grpc.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}")
        try:
            grpc.channel_ready_future(channel).result(timeout=10)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            self.rejections.append(f"cannot dial {request.endpoint}: {exc}")
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial {request.endpoint}")
        if options != request.options:
            channel.close()
            self.rejections.append(f"{request.resource_name}: options differ")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "GetDevicePluginOptions differs from Register options"
            )
        endpoint = Endpoint(request.resource_name, request.endpoint, channel, stub, options)
        with self._cond:
            previous = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            self.registrations.append(request.resource_name)
        if previous is not None:
            self._close(previous)
        endpoint.stream = stub.ListAndWatch(api_pb2.Empty())
        endpoint.thread = threading.Thread(target=self._consume, args=(endpoint,), daemon=True)
        endpoint.thread.start()
        return api_pb2.Empty()

    def _registration_problem(self, request: api_pb2.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported version is {SUPPORTED_VERSIONS[0]!r}"
            )
        if not is_extended_resource_name(request.resource_name):
            return f"the ResourceName {request.resource_name!r} is invalid"
        if not request.endpoint or "/" in request.endpoint:
            return f"endpoint {request.endpoint!r} must be a socket file name in {self.plugin_dir}"
        path = self.plugin_dir / request.endpoint
        if not path.exists() or not stat.S_ISSOCK(path.stat().st_mode):
            return f"endpoint {path} is not a unix socket"
        if path.stat().st_mode & 0o077:
            return f"endpoint {path} is accessible by group or others"
        return None

    def _consume(self, endpoint: Endpoint) -> None:
        assert endpoint.stream is not None
        try:
            for response in endpoint.stream:
                devices = {
                    d.ID: SeenDevice(d.ID, d.health, tuple(n.ID for n in d.topology.nodes))
                    for d in response.devices
                }
                with self._cond:
                    endpoint.devices = devices
                    endpoint.updates += 1
                    self._cond.notify_all()
        except grpc.RpcError:
            pass
        with self._cond:
            endpoint.ended = True  # the kubelet marks the resource unhealthy; only Register restores it
            self._cond.notify_all()

    # ---- queries ---------------------------------------------------------------------------
    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def resources(self) -> list[str]:
        with self._cond:
            return sorted(r for r, e in self._endpoints.items() if not e.ended)

    def endpoint(self, resource: str) -> Endpoint:
        with self._cond:
            return self._endpoints[resource]

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        with self._cond:
            endpoint = self._endpoints.get(resource)
            return dict(endpoint.devices) if endpoint else {}

    def healthy(self, resource: str) -> set[str]:
        return {d.id for d in self.devices(resource).values() if d.health == HEALTHY}

    def stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        return self.endpoint(resource).stub

    # ---- admission -------------------------------------------------------------------------
    def allocate(
        self, resource: str, count: int, *, numa_hint: Iterable[int] | None = None
    ) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        """Admit one container asking for ``count`` devices of ``resource``, as the kubelet does."""
        chosen = self.choose(resource, count, numa_hint=numa_hint)
        response = self.stub(resource).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
            ),
            timeout=10,
        )
        if len(response.container_responses) != 1:
            raise AllocationFailedError(
                f"{resource}: Allocate returned {len(response.container_responses)} responses"
            )
        with self._cond:
            self._allocated.setdefault(resource, set()).update(chosen)
        return chosen, response.container_responses[0]

    def release(self, resource: str, ids: Iterable[str]) -> None:
        with self._cond:
            self._allocated.get(resource, set()).difference_update(ids)

    def allocated(self, resource: str) -> set[str]:
        with self._cond:
            return set(self._allocated.get(resource, set()))

    def choose(self, resource: str, count: int, *, numa_hint: Iterable[int] | None = None) -> list[str]:
        """``devicesToAllocate`` with ``filterByAffinity`` for a Topology Manager NUMA hint."""
        endpoint = self.endpoint(resource)
        available = sorted(self.healthy(resource) - self.allocated(resource))
        if len(available) < count:
            raise AllocationFailedError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(available)}"
            )
        if numa_hint is None:
            return self._preferred_then_fill(endpoint, available, [], count, available)
        hint = set(numa_hint)
        devices = self.devices(resource)
        aligned = [d for d in available if set(devices[d].numa_nodes) & hint]
        unaligned = [d for d in available if devices[d].numa_nodes and not set(devices[d].numa_nodes) & hint]
        no_affinity = [d for d in available if not devices[d].numa_nodes]
        if count < len(aligned):
            return self._preferred_then_fill(endpoint, aligned, [], count, aligned)
        if count == len(aligned):
            return aligned
        return self._preferred_then_fill(
            endpoint, available, aligned, count, aligned + unaligned + no_affinity
        )

    def _preferred_then_fill(
        self, endpoint: Endpoint, offered: list[str], must: list[str], count: int, fallback: list[str]
    ) -> list[str]:
        chosen = list(must)
        if endpoint.options.get_preferred_allocation_available:
            request = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=offered, must_include_deviceIDs=must, allocation_size=count
                    )
                ]
            )
            response = endpoint.stub.GetPreferredAllocation(request, timeout=10)
            preferred = response.container_responses[0].deviceIDs if response.container_responses else []
            chosen += [d for d in preferred if d in offered and d not in chosen][: count - len(chosen)]
        chosen += [d for d in fallback if d not in chosen][: count - len(chosen)]
        return chosen
