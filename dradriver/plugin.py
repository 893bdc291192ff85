"""The kubelet DRA plugin: registration through the plugin watcher and the DRA gRPC service.

Two unix sockets, as the kubelet's DRA manager (``pkg/kubelet/cm/dra``) expects of a driver:

- ``<kubelet root>/plugins/gpuweave.io/dra.sock`` serves ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  and the same calls as ``...dra.v1beta1.DRAPlugin`` (a 1.32-1.33 kubelet uses v1beta1);
- ``<kubelet root>/plugins_registry/gpuweave.io-reg.sock`` serves ``pluginregistration.Registration``:
  ``GetInfo`` answers type ``DRAPlugin``, name ``gpuweave.io``, the DRA socket's path as endpoint and
  the services ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` (the kubelet picks the first it knows) and,
  with a health stream, ``v1.DRAResourceHealth`` (``health_stream``), served on the DRA socket;
  ``NotifyRegistrationStatus`` records whether the kubelet accepted us.

The DRA socket is bound before the registration socket appears, so the kubelet never dials an
endpoint that is not there yet. Each claim's outcome is its own: a claim that cannot be prepared
gets an error string in the response and the others are prepared. A request the service cannot
decode, or a claim without a UID (the response is keyed by it), is ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from google.protobuf.message import Message

from devicemodel.errors import GpuweaveError
from dradriver.devices import DRIVER
from dradriver.health_stream import HealthStream
from dradriver.prepare import ClaimError, ClaimPreparer, ClaimRef, PreparedDevice
from nodeagent.grpc_decoding import decoding_handler
from proto.dra.v1 import api_pb2 as dra_v1
from proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from proto.pluginregistration.v1 import api_pb2 as registration_pb2

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICE = "v1.DRAResourceHealth"
REGISTRATION_SERVICE = "pluginregistration.Registration"
WORKERS = 8  # prepare and unprepare calls; health streams take at most streams.MAX_STREAMS of them
MAX_UNIX_PATH = 107


def _unary(methods: Mapping[str, tuple[type[Message], Callable[[Any, grpc.ServicerContext], Any]]]) -> Any:
    return {
        name: grpc.unary_unary_rpc_method_handler(
            decoding_handler(message, method), response_serializer=lambda m: m.SerializeToString()
        )
        for name, (message, method) in methods.items()
    }


class DraService:
    """NodePrepareResources / NodeUnprepareResources for one API version's messages."""

    def __init__(self, preparer: ClaimPreparer, pb: ModuleType) -> None:
        self._preparer = preparer
        self._pb = pb

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        pb = self._pb
        methods = {
            "NodePrepareResources": (pb.NodePrepareResourcesRequest, self.NodePrepareResources),
            "NodeUnprepareResources": (pb.NodeUnprepareResourcesRequest, self.NodeUnprepareResources),
        }
        return grpc.method_handlers_generic_handler(f"{pb.DESCRIPTOR.package}.DRAPlugin", _unary(methods))

    @staticmethod
    def _refs(request: Any, context: grpc.ServicerContext) -> list[ClaimRef]:
        refs = [ClaimRef(c.uid, c.namespace, c.name) for c in request.claims]
        if any(not ref.uid for ref in refs):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "every claim needs its uid (the response is keyed by it)"
            )
        return refs

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = self._pb.NodePrepareResourcesResponse()
        for ref in self._refs(request, context):
            answer = response.claims[ref.uid]
            try:
                if not ref.namespace or not ref.name:
                    raise ClaimError(f"claim uid {ref.uid}: namespace and name are required")
                for device in self._preparer.prepare(ref):
                    answer.devices.append(self._device(device))
            except ClaimError as exc:
                answer.error = str(exc)
            except Exception as exc:  # one claim's surprise must not fail the others, nor the agent
                log.exception("preparing %s failed", ref.describe())
                answer.error = f"{ref.describe()}: internal error in the gpuweave node agent: {exc}"
        return response

    def _device(self, device: PreparedDevice) -> Any:
        """The kubelet's ``Device``; a share's ID only where the API version has the field (v1)."""
        fields: dict[str, Any] = {
            "request_names": list(device.request_names),
            "pool_name": device.pool_name,
            "device_name": device.device_name,
            "cdi_device_ids": list(device.cdi_device_ids),
        }
        if device.share_id and "share_id" in self._pb.Device.DESCRIPTOR.fields_by_name:
            fields["share_id"] = device.share_id
        return self._pb.Device(**fields)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        response = self._pb.NodeUnprepareResourcesResponse()
        for ref in self._refs(request, context):
            answer = response.claims[ref.uid]
            try:
                self._preparer.unprepare(ref)
            except ClaimError as exc:
                answer.error = str(exc)
            except Exception as exc:
                log.exception("unpreparing %s failed", ref.describe())
                answer.error = f"{ref.describe()}: internal error in the gpuweave node agent: {exc}"
        return response


class RegistrationService:
    """``pluginregistration.Registration`` for the kubelet's plugin watcher."""

    def __init__(
        self,
        endpoint: Path,
        *,
        versions: tuple[str, ...] = SUPPORTED_VERSIONS,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.versions = versions
        self._on_registered = on_registered
        self.registered = threading.Event()
        self.error = ""
        self.notifications = 0

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        methods = {
            "GetInfo": (registration_pb2.InfoRequest, self.GetInfo),
            "NotifyRegistrationStatus": (registration_pb2.RegistrationStatus, self.NotifyRegistrationStatus),
        }
        return grpc.method_handlers_generic_handler(REGISTRATION_SERVICE, _unary(methods))

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=list(self.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.notifications += 1
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
            if self._on_registered is not None:  # a (re)started kubelet wiped our slices: publish again
                self._on_registered()
            log.warning("registered with the kubelet as DRA driver %s (%s)", DRIVER, self.endpoint)
        else:
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error or "no reason given")
        return registration_pb2.RegistrationStatusResponse()


def _serve(path: Path, handlers: list[grpc.GenericRpcHandler[Any, Any]], name: str) -> grpc.Server:
    if len(str(path)) > MAX_UNIX_PATH:
        raise GpuweaveError(f"socket path {path} is {len(str(path))} characters (max {MAX_UNIX_PATH})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=name))
    server.add_generic_rpc_handlers(handlers)
    if server.add_insecure_port(f"unix:{path}") == 0:
        raise GpuweaveError(f"cannot bind {path}: check the directory exists and is writable")
    server.start()
    os.chmod(path, 0o600)
    return server


class DraPluginServer:
    """Both sockets of the DRA plugin under the kubelet's root directory."""

    def __init__(
        self,
        preparer: ClaimPreparer,
        *,
        kubelet_root: Path,
        health: HealthStream | None = None,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        """``health``: also serve ``v1.DRAResourceHealth`` (and advertise it); ``on_registered``: called
        whenever the kubelet reports the registration accepted."""
        self.socket_path = kubelet_root / "plugins" / DRIVER / "dra.sock"
        self.registration_path = kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"
        versions = SUPPORTED_VERSIONS + ((HEALTH_SERVICE,) if health is not None else ())
        self.registration = RegistrationService(
            self.socket_path, versions=versions, on_registered=on_registered
        )
        self._services = [DraService(preparer, dra_v1), DraService(preparer, dra_v1beta1)]
        self._health = health
        self._servers: list[tuple[grpc.Server, Path]] = []

    def start(self) -> None:
        handlers = [s.handler() for s in self._services]
        if self._health is not None:
            handlers.append(self._health.handler())
        dra = _serve(self.socket_path, handlers, "dra")
        self._servers.append((dra, self.socket_path))
        registration = _serve(self.registration_path, [self.registration.handler()], "dra-reg")
        self._servers.append((registration, self.registration_path))
        log.info("DRA plugin serving %s, registration at %s", self.socket_path, self.registration_path)

    def stop(self, grace: float = 0.5) -> None:
        """Registration socket first (the kubelet deregisters), then the service."""
        if self._health is not None:
            self._health.stop()  # ends open health streams, so the server's stop does not wait on them
        for server, path in reversed(self._servers):
            server.stop(grace).wait()
            path.unlink(missing_ok=True)
        self._servers.clear()
