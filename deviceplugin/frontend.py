"""The device-plugin front end of the node agent: one gRPC server per resource, registered with the
kubelet, answering GetPreferredAllocation and Allocate from the core's lists.

``DevicePluginFrontEnd`` is attached to a ``nodeagent.agent.NodeAgent`` (``device_plugin_agent``
builds both): the agent hands it each new resource's ``ResourceState`` and each new inventory; it
serves the state at ``<kubelet-dir>/gpuweave-*.sock``, registers it (``KubeletWatcher``), prefers
devices with the extender's hint (``HandoffSource``), the GPU set chooser and the sibling grants,
and grants Allocate through ``nodeagent.allocation.grant_for``, recording each grant in the agent's
``allocations`` and telling its ``claim_hook`` first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol, runtime_checkable

from devicemodel.inventory import NodeInventory
from deviceplugin.preferred import GpuSetChooser, PreferenceRequest, preferred_devices
from deviceplugin.registration import KubeletWatcher
from deviceplugin.server import DevicePluginService, ResourceServer
from deviceplugin.siblings import SiblingGrants
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.allocation import ContainerGrant, grant_for
from nodeagent.cdi import CdiPublisher
from nodeagent.devices import PluginDevice
from nodeagent.errors import AllocationRejectedError
from nodeagent.metrics import AgentMetrics
from nodeagent.podresources import AllocationLog
from nodeagent.state import ResourceState

log = logging.getLogger(__name__)

PREPARE_AFTER_S = 5.0  # the chooser is prepared once every resource is registered, or after this long


@runtime_checkable
class PreparableChooser(Protocol):
    """A ``GpuSetChooser`` with expensive set-up (imports, a graph) that can run ahead of its first call."""

    def __call__(
        self, available: frozenset[int], size: int, must_include: frozenset[int]
    ) -> tuple[int, ...] | None: ...

    def prepare(self) -> bool: ...


class HandoffSource(Protocol):
    """Supplies the extender's recorded device choice for the container being admitted."""

    def hint(self, request: PreferenceRequest, devices: dict[str, PluginDevice]) -> list[str] | None: ...

    def observe_allocation(self, resource: str, device_ids: list[str]) -> None: ...


class DevicePluginFrontEnd:
    """The kubelet's device-plugin API over one agent's lists (``nodeagent.agent.FrontEnd``)."""

    def __init__(
        self,
        agent: NodeAgent,
        *,
        chooser_for: Callable[[NodeInventory], GpuSetChooser | None] | None = None,
        handoff: HandoffSource | None = None,
        siblings: SiblingGrants | None = None,
    ) -> None:
        self._agent = agent
        self._chooser_for = chooser_for
        self._handoff = handoff
        self._siblings = siblings or SiblingGrants()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._servers: dict[str, ResourceServer] = {}
        self._chooser: GpuSetChooser | None = None
        self._prepare: threading.Thread | None = None
        self._watcher = KubeletWatcher(
            agent.config.kubelet_dir,
            servers=self._server_list,
            poll_interval=agent.config.poll_interval,
            on_registered=self._registered,
        )

    # ---- nodeagent.agent.FrontEnd ----------------------------------------------------------
    def add_resource(self, name: str, state: ResourceState) -> None:
        service = DevicePluginService(
            state,
            prefer=self._prefer,
            grant=partial(self._grant, name),
            on_error=partial(self._preference_failed, name),
        )
        server = ResourceServer(service, resource=name, kubelet_dir=self._agent.config.kubelet_dir)
        server.start()  # serving before the watcher registers it
        with self._lock:
            self._servers[name] = server

    def inventory_changed(self, inventory: NodeInventory) -> None:
        chooser = self._chooser_for(inventory) if self._chooser_for else None
        with self._lock:
            self._chooser = chooser

    def start(self) -> None:
        """Register every resource (the watcher's first round), then prepare the chooser."""
        self._watcher.start()
        self._prepare = threading.Thread(target=self._prepare_chooser, name="chooser-prepare", daemon=True)
        self._prepare.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._prepare is not None:
            self._prepare.join()
        self._watcher.stop()
        for server in self._server_list():
            server.stop()

    def socket_of(self, resource: str) -> str:
        with self._lock:
            server = self._servers.get(resource)
        return str(server.socket_path) if server is not None else ""

    def registered(self) -> dict[str, bool]:
        return self._watcher.registered()

    def registration_counts(self) -> dict[str, int]:
        return self._watcher.registration_counts()

    # ---- the chooser -----------------------------------------------------------------------
    def _prepare_chooser(self) -> None:
        """Prepare the topology chooser once registration is done, so neither start-up nor the
        first GetPreferredAllocation waits for it (a request before then prepares it itself)."""
        deadline = time.monotonic() + PREPARE_AFTER_S
        while time.monotonic() < deadline and not self._all_registered():
            if self._stopping.wait(self._agent.config.poll_interval):
                return
        with self._lock:
            chooser = self._chooser
        if isinstance(chooser, PreparableChooser) and not self._stopping.is_set():
            chooser.prepare()

    def _all_registered(self) -> bool:
        registered = self._watcher.registered()
        return bool(registered) and all(registered.get(name, False) for name in self._agent.resource_names())

    # ---- kubelet-facing policy -------------------------------------------------------------
    def _prefer(self, request: PreferenceRequest) -> list[str]:
        state = self._agent.state_of(request.resource)
        with self._lock:
            chooser = self._chooser
        devices = state.devices()
        hint = self._handoff.hint(request, devices) if self._handoff is not None else None
        near = self._siblings.near(request.resource)
        return preferred_devices(request, devices=devices, gpu_chooser=chooser, hint=hint, near=near)

    def _preference_failed(self, resource_name: str, what: str, exc: BaseException) -> None:
        self._agent.metrics.preferred_fallbacks.labels(resource_name).inc()

    def _grant(self, resource_name: str, device_ids: Sequence[str]) -> ContainerGrant:
        agent = self._agent
        state = agent.state_of(resource_name)
        agent.allocations.record(device_ids)  # first: a check that withholds one after this sees it
        self._claim(state, device_ids)
        try:
            grant = grant_for(
                resource_name,
                device_ids,
                devices=state.devices(),
                unhealthy=state.unhealthy(),
                mps_pipe_dir=agent.mps_pipes,
                listing=agent.config.device_listing,
            )
        except AllocationRejectedError:
            agent.metrics.allocations.labels(resource_name, "rejected").inc()
            raise
        agent.metrics.allocations.labels(resource_name, "granted").inc()
        granted = state.devices()
        self._siblings.remember(resource_name, [granted[i] for i in device_ids if i in granted])
        if self._handoff is not None:
            self._handoff.observe_allocation(resource_name, list(device_ids))
        return grant

    def _claim(self, state: ResourceState, device_ids: Sequence[str]) -> None:
        """An active check on the GPUs behind ``device_ids`` lets go of them before this returns."""
        hook = self._agent.claim_hook
        if hook is None:
            return
        devices = state.devices()
        gpus = frozenset(
            uuid for uuid in (devices[i].gpu_uuid if i in devices else None for i in device_ids) if uuid
        )
        if gpus:
            try:
                hook(gpus)
            except Exception:  # never the kubelet's failure: the grant goes on
                log.exception("the active-check claim of %s failed", sorted(gpus))

    # ---- registration ----------------------------------------------------------------------
    def _server_list(self) -> list[ResourceServer]:
        with self._lock:
            return list(self._servers.values())

    def _registered(self, resource: str) -> None:
        self._agent.metrics.registrations.labels(resource).inc()
        self._agent.write_status()


def device_plugin_agent(
    config: AgentConfig,
    *,
    discover: Callable[[], NodeInventory],
    chooser_for: Callable[[NodeInventory], GpuSetChooser | None] | None = None,
    handoff: HandoffSource | None = None,
    metrics: AgentMetrics | None = None,
    siblings: SiblingGrants | None = None,
    allocations: AllocationLog | None = None,
    cdi: CdiPublisher | None = None,
) -> NodeAgent:
    """A node agent whose lists the kubelet gets through the device-plugin API (not started)."""
    agent = NodeAgent(config, discover=discover, metrics=metrics, allocations=allocations, cdi=cdi)
    agent.attach(DevicePluginFrontEnd(agent, chooser_for=chooser_for, handoff=handoff, siblings=siblings))
    return agent
