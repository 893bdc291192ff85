"""The kubelet's pod-resources API v1 served on a unix socket, for transport tests.

It answers as the kubelet's ``v1.PodResourcesLister`` does (kubelet
``pkg/kubelet/apis/podresources``): ``List`` returns every admitted pod with the devices each
container was given, ``GetAllocatableResources`` the devices the node can hand out, ``Get`` one pod
(NOT_FOUND for an unknown pod). Tests admit and remove pods; ``hold()`` makes calls hang until
``release()`` (a stuck kubelet), and ``stop()`` removes the socket (a kubelet that went away).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import grpc

from proto.podresources.v1 import api_pb2, api_pb2_grpc

Containers = dict[str, dict[str, list[str]]]  # container -> resource name -> device IDs


class PodResourcesServer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.allocatable: dict[str, list[str]] = {}  # resource name -> device IDs
        self.calls = 0
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], Containers] = {}
        self._open = threading.Event()
        self._open.set()
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ---- pods ------------------------------------------------------------------------------
    def admit(self, namespace: str, name: str, containers: Containers) -> None:
        with self._lock:
            self._pods[(namespace, name)] = {c: dict(r) for c, r in containers.items()}

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)

    def hold(self) -> None:
        """Calls block (as on a kubelet that stopped answering) until ``release``."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=4)
        server = grpc.server(self._executor)
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> PodResourcesServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    # ---- PodResourcesLister ----------------------------------------------------------------
    def List(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self._wait_open(context)
        with self._lock:
            pods = [self._pod(key, containers) for key, containers in sorted(self._pods.items())]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def GetAllocatableResources(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        self._wait_open(context)
        with self._lock:
            devices = [
                api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                for resource, ids in sorted(self.allocatable.items())
            ]
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    def Get(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        self._wait_open(context)
        key = (request.pod_namespace, request.pod_name)
        with self._lock:
            containers = self._pods.get(key)
        if containers is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key[0]}/{key[1]} not found")
        return api_pb2.GetPodResourcesResponse(pod_resources=self._pod(key, containers or {}))

    def _wait_open(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls += 1
        while not self._open.wait(0.05):
            if not context.is_active():
                return

    @staticmethod
    def _pod(key: tuple[str, str], containers: Containers) -> api_pb2.PodResources:
        return api_pb2.PodResources(
            namespace=key[0],
            name=key[1],
            containers=[
                api_pb2.ContainerResources(
                    name=container,
                    devices=[
                        api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                        for resource, ids in sorted(resources.items())
                    ],
                )
                for container, resources in sorted(containers.items())
            ],
        )
