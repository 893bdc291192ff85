"""The kubelet side of the device-plugin API for the simulation, over real unix sockets.

Each simulated node gets a ``SimKubelet``: it serves ``v1beta1.Registration`` on
``<dir>/kubelet.sock``, dials every plugin that registers, consumes its ``ListAndWatch`` stream
(keeping each device's health and when it last changed) and, when a pod lands on the node, calls
``GetPreferredAllocation`` (if offered) and ``Allocate`` for the devices the extender chose, as the
kubelet's device manager does at container admission. ``gpuweave gpu-check`` uses it as the kubelet
of a real host's node agent.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.experimental

from devicemodel.errors import GpuweaveError
from proto.v1beta1 import api_pb2, api_pb2_grpc

HEALTHY = "Healthy"
# Each plugin's ListAndWatch stream is read on a thread of its own. gRPC's default stream iterator
# waits in 0.1 s slices (plus a channel thread of its own), so every idle stream woke the process
# ten times a second; on this option the read waits inside gRPC's core for the next message. A
# sampled 1,000-node run has ~200 such streams in one process.
CHANNEL_OPTIONS = ((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),)
CALL_TIMEOUT_S = 10.0  # GetPreferredAllocation and Allocate, by default


class KubeletCallError(GpuweaveError):
    """A device-plugin call from the simulated kubelet failed."""


@dataclass
class _Plugin:
    resource: str
    channel: grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    options: api_pb2.DevicePluginOptions
    health: dict[str, str] = field(default_factory=dict)
    changed_at: dict[str, float] = field(default_factory=dict)
    updates: int = 0


class SimKubelet(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path, *, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        """``call_timeout_s``: how long a GetPreferredAllocation or Allocate may take (the
        simulation's agents get longer, so a loaded machine slows a run without changing it)."""
        self.plugin_dir = plugin_dir
        self._call_timeout_s = call_timeout_s
        self._plugins: dict[str, _Plugin] = {}
        self._lock = threading.Condition()
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-kubelet")
        self._server: grpc.Server | None = None
        self._streams: list[threading.Thread] = []
        self._stopping = threading.Event()

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(self._executor)
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._server = server

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            plugins = list(self._plugins.values())
            self._plugins.clear()
        for plugin in plugins:
            plugin.channel.close()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        for stream in self._streams:
            stream.join(timeout=5)
        self._executor.shutdown(wait=True)

    def Register(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        channel = grpc.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}", options=CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(channel).result(timeout=10)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        except (grpc.FutureTimeoutError, grpc.RpcError):
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial {request.endpoint}")
        plugin = _Plugin(request.resource_name, channel, stub, options)
        with self._lock:
            old = self._plugins.pop(request.resource_name, None)
            self._plugins[request.resource_name] = plugin
        if old is not None:
            old.channel.close()
        stream = threading.Thread(
            target=self._watch, args=(plugin,), name=f"law-{plugin.resource}", daemon=True
        )
        stream.start()
        self._streams.append(stream)
        return api_pb2.Empty()

    def _watch(self, plugin: _Plugin) -> None:
        try:
            for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                now = time.monotonic()
                with self._lock:
                    for device in response.devices:
                        if plugin.health.get(device.ID) != device.health:
                            plugin.changed_at[device.ID] = now
                        plugin.health[device.ID] = device.health
                    plugin.updates += 1
                    self._lock.notify_all()
        except grpc.RpcError:
            return  # the channel closed (stop or re-registration)

    def resources(self) -> dict[str, int]:
        """Resource name -> healthy devices, as the node's allocatable would show."""
        with self._lock:
            return {r: sum(h == HEALTHY for h in p.health.values()) for r, p in self._plugins.items()}

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> health, as ``resource``'s plugin last listed them (empty: not registered)."""
        with self._lock:
            plugin = self._plugins.get(resource)
            return dict(plugin.health) if plugin else {}

    def preferred(self, resource: str, count: int) -> list[str] | None:
        """The plugin's GetPreferredAllocation answer for ``count`` of its healthy devices, as the
        kubelet asks it at admission; None when the plugin does not offer the call."""
        with self._lock:
            plugin = self._plugins.get(resource)
            available = [d for d, h in (plugin.health.items() if plugin else []) if h == HEALTHY]
        if plugin is None:
            raise KubeletCallError(f"no device plugin registered for {resource}")
        if not plugin.options.get_preferred_allocation_available:
            return None
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, allocation_size=count
                )
            ]
        )
        try:
            response = plugin.stub.GetPreferredAllocation(request, timeout=self._call_timeout_s)
        except grpc.RpcError as exc:
            raise KubeletCallError(
                f"{resource} GetPreferredAllocation({count} devices) failed: {exc.details()}"
            ) from exc
        return list(response.container_responses[0].deviceIDs) if response.container_responses else []

    def wait_for(self, resources: set[str], *, timeout: float = 20.0) -> bool:
        """Until every named resource is registered and has listed its devices."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not all(r in self._plugins and self._plugins[r].updates for r in resources):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def wait_healthy(self, device_id: str, *, since: float, timeout: float = 5.0) -> float | None:
        """Seconds from ``since`` (monotonic) until no plugin lists ``device_id`` (or a device on
        that GPU) as not Healthy any more; None if that does not happen within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._healthy_locked(device_id):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return time.monotonic() - since

    def wait_unhealthy(self, device_id: str, *, since: float, timeout: float = 20.0) -> float | None:
        """Seconds from ``since`` (monotonic) until ``device_id`` (or any device on that GPU) is
        reported not Healthy; None if that does not happen within ``timeout``."""
        started = since
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for plugin in self._plugins.values():
                    for device, health in plugin.health.items():
                        if device.startswith(device_id) and health != HEALTHY:
                            return plugin.changed_at.get(device, time.monotonic()) - started
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)

    def healthy(self, device_id: str) -> bool:
        """True unless some plugin lists ``device_id`` (or a device on that GPU) as not Healthy."""
        with self._lock:
            return self._healthy_locked(device_id)

    def _healthy_locked(self, device_id: str) -> bool:
        return all(
            health == HEALTHY
            for plugin in self._plugins.values()
            for device, health in plugin.health.items()
            if device.startswith(device_id)
        )

    def admit(self, resource: str, device_ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        """GetPreferredAllocation (when offered) then Allocate, for one container."""
        self.preferred(resource, len(device_ids))
        return self.allocate(resource, device_ids)

    def allocate(self, resource: str, device_ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        """Allocate alone, for one container (``admit`` asks for a preference first)."""
        with self._lock:
            plugin = self._plugins.get(resource)
        if plugin is None:
            raise KubeletCallError(f"no device plugin registered for {resource}")
        try:
            response = plugin.stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)]
                ),
                timeout=self._call_timeout_s,
            )
        except grpc.RpcError as exc:
            raise KubeletCallError(
                f"{resource} Allocate({len(device_ids)} devices) failed: {exc.details()}"
            ) from exc
        return response.container_responses[0]
