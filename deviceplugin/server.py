"""One resource's kubelet-facing gRPC server on its own unix socket.

``DevicePluginService`` answers the five v1beta1 RPCs from a ``ResourceState`` and two policy
callables; ``ResourceServer`` owns the socket's lifecycle: bind (mode 0600), serve, notice when the
socket file was deleted (kubelet restart) and rebind on the same path with the same servicer, so
device IDs and state survive. Bad requests get INVALID_ARGUMENT with the reason; the server keeps
serving. GetPreferredAllocation never fails a pod for an internal error: it answers empty.

ListAndWatch streams have their own budget (``streams.StreamBudget``: at most ``MAX_STREAMS`` per
resource, more refused with RESOURCE_EXHAUSTED), so the other ``SERVER_WORKERS - MAX_STREAMS``
workers always answer Allocate, GetPreferredAllocation and the option calls.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from deviceplugin.preferred import PreferenceRequest
from nodeagent.allocation import ContainerGrant
from nodeagent.errors import AllocationRejectedError, DevicePluginError
from nodeagent.grpc_decoding import decoding_handler
from nodeagent.state import ResourceState
from nodeagent.streams import StreamBudget
from proto.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "v1beta1.DevicePlugin"
MAX_UNIX_PATH = 107
SERVER_WORKERS = 8  # MAX_STREAMS of them at most for ListAndWatch, the rest for the unary calls
Preference = Callable[[PreferenceRequest], list[str]]
Grant = Callable[[Sequence[str]], ContainerGrant]
ErrorSink = Callable[[str, BaseException], None]


def to_response(grant: ContainerGrant) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=grant.envs,
        mounts=[
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in grant.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
            )
            for n in grant.device_nodes
        ],
        annotations=grant.annotations,
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in grant.cdi_devices],
    )


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The v1beta1 DevicePlugin service of one resource."""

    def __init__(
        self, state: ResourceState, *, prefer: Preference, grant: Grant, on_error: ErrorSink
    ) -> None:
        self._state = state
        self._prefer = prefer
        self._grant = grant
        self._on_error = on_error
        self._streams = StreamBudget(f"ListAndWatch of {state.resource}")

    def end_streams(self) -> None:
        self._state.end_streams()

    @staticmethod
    def options() -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def GetDevicePluginOptions(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self.options()

    def _list(self) -> api_pb2.ListAndWatchResponse:
        devices = []
        for status in self._state.snapshot():
            device = api_pb2.Device(ID=status.device.id, health=status.health)
            if status.device.numa_node is not None:
                device.topology.nodes.append(api_pb2.NUMANode(ID=status.device.numa_node))
            devices.append(device)
        return api_pb2.ListAndWatchResponse(devices=devices)

    def ListAndWatch(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        with self._streams.slot(context):
            yield from self._watch(context)

    def _watch(self, context: grpc.ServicerContext) -> Iterator[api_pb2.ListAndWatchResponse]:
        watcher = self._state.subscribe()
        context.add_callback(lambda: watcher.put(False))
        try:
            yield self._list()
            while watcher.get():
                while not watcher.empty():  # coalesce a burst of changes into one message
                    if not watcher.get():
                        return
                yield self._list()
        finally:
            self._state.unsubscribe(watcher)

    def GetPreferredAllocation(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for container in request.container_requests:
            wanted = PreferenceRequest(
                resource=self._state.resource,
                available=tuple(container.available_deviceIDs),
                must_include=tuple(container.must_include_deviceIDs),
                size=container.allocation_size,
            )
            try:
                chosen = self._prefer(wanted)
            except AllocationRejectedError as exc:
                log.warning("GetPreferredAllocation rejected: %s", exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except Exception as exc:  # never fail admission for our own fault: answer empty
                log.exception("GetPreferredAllocation for %s failed; answering empty", self._state.resource)
                self._on_error("preferred_allocation", exc)
                chosen = []
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        if not request.container_requests:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self._state.resource}: no container requests")
        responses = []
        for container in request.container_requests:
            try:
                responses.append(to_response(self._grant(list(container.devices_ids))))
            except AllocationRejectedError as exc:
                log.warning("Allocate rejected: %s", exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def strict_handler(service: DevicePluginService) -> grpc.GenericRpcHandler[Any, Any]:
    """The v1beta1 DevicePlugin service with request decoding under our control."""
    unary: dict[str, tuple[type[Message], Callable[[Any, grpc.ServicerContext], Any]]] = {
        "GetDevicePluginOptions": (api_pb2.Empty, service.GetDevicePluginOptions),
        "GetPreferredAllocation": (api_pb2.PreferredAllocationRequest, service.GetPreferredAllocation),
        "Allocate": (api_pb2.AllocateRequest, service.Allocate),
        "PreStartContainer": (api_pb2.PreStartContainerRequest, service.PreStartContainer),
    }
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            decoding_handler(message, method), response_serializer=lambda m: m.SerializeToString()
        )
        for name, (message, method) in unary.items()
    }
    handlers["ListAndWatch"] = grpc.unary_stream_rpc_method_handler(
        decoding_handler(api_pb2.Empty, service.ListAndWatch),
        response_serializer=lambda m: m.SerializeToString(),
    )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def socket_name_for(resource: str) -> str:
    """Short, stable socket file name: ``gpuweave-<name after the domain>.sock``."""
    return f"gpuweave-{resource.rsplit('/', 1)[-1]}.sock"


class ResourceServer:
    """Serves one resource on ``<kubelet_dir>/<socket name>``; can rebind after the file is deleted."""

    def __init__(self, service: DevicePluginService, *, resource: str, kubelet_dir: Path) -> None:
        self.resource = resource
        self.service = service
        self.socket_path = kubelet_dir / socket_name_for(resource)
        if len(str(self.socket_path)) > MAX_UNIX_PATH:
            raise DevicePluginError(
                f"socket path {self.socket_path} is {len(str(self.socket_path))} characters; unix sockets "
                f"allow {MAX_UNIX_PATH}: use a shorter --kubelet-dir"
            )
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._inode: int | None = None

    @property
    def endpoint(self) -> str:
        return self.socket_path.name

    def start(self) -> None:
        """Bind and serve; the socket exists (mode 0600) when this returns."""
        self.stop()
        self.socket_path.unlink(missing_ok=True)
        executor = ThreadPoolExecutor(max_workers=SERVER_WORKERS, thread_name_prefix=f"dp-{self.endpoint}")
        server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((strict_handler(self.service),))
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            executor.shutdown(wait=False)
            raise DevicePluginError(
                f"cannot bind {self.socket_path}: check the directory exists and is writable"
            )
        os.chmod(self.socket_path, 0o600)
        server.start()
        self._server, self._executor = server, executor
        self._inode = self.socket_path.stat().st_ino
        log.info("serving %s on %s", self.resource, self.socket_path)

    def socket_alive(self) -> bool:
        """True while our socket file is still the one we bound (a kubelet restart deletes it)."""
        try:
            info = self.socket_path.stat()
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(info.st_mode) and info.st_ino == self._inode

    def stop(self, grace: float = 0.5) -> None:
        server, executor = self._server, self._executor
        self._server = self._executor = None
        if server is not None:
            self.service.end_streams()
            server.stop(grace).wait()
        if executor is not None:
            executor.shutdown(wait=True)
        if self._inode is not None and self.socket_alive():
            self.socket_path.unlink(missing_ok=True)
        self._inode = None
