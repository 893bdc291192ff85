"""The node agent: every resource's server, kubelet registration, health, control socket.

``NodeAgent`` is the in-process API the rest of the node talks to:

- ``refresh_inventory()`` re-discovers hardware (after a MIG reshape or a hot-plug) and updates
  each resource's list in place; a new resource name gets its own server, socket and
  registration; a resource that lost every device streams an empty list; nothing else restarts.
- ``set_device_health(device_id, healthy, reason)`` records a fault on a device ID or on a
  physical GPU UUID (which fans out to that GPU's MIG devices and shares, never to siblings).
- ``withhold(ids, reason)`` / ``release(ids)``: devices reported Unhealthy so the kubelet stops
  placing new work there (the Suspect state of the health design), without calling them failed;
  ``set_gate(name, reasons)`` does the same for a named node-level condition (the NVSwitch fabric).
  The bookkeeping behind these (faults, withheld devices, gates, lost GPUs) is
  ``nodeagent.health_book.DeviceHealthBook``; the agent pushes its verdicts into every list
  and streams the change.
- ``control.add_route(method, handler)`` adds a command to ``STATE_DIR/agent.sock``.
- ``add_listener(fn)`` calls ``fn()`` after every change (the publisher uses it).
- ``allocations`` holds the device IDs granted in Allocate since start, with when (a second source
  of "held by a pod" next to the kubelet's pod-resources API).
- ``claim_hook`` (health's active checks) is told the GPUs of every Allocate, after the grant is
  recorded in ``allocations`` and before it is validated: a check running on one of them lets go
  of it first, so a pod the kubelet admitted before a check's withholding reached it still gets
  its GPU (``health.active_claims``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan
from devicemodel.state_file import write_json_atomically
from deviceplugin.preferred import GpuSetChooser, PreferenceRequest, preferred_devices
from deviceplugin.registration import KubeletWatcher
from deviceplugin.server import DevicePluginService, ResourceServer
from deviceplugin.siblings import SiblingGrants
from nodeagent.allocation import ContainerGrant, DeviceListing, MpsPipeLookup, grant_for
from nodeagent.cdi import CdiPublisher
from nodeagent.control import ControlServer
from nodeagent.devices import PluginDevice, build_catalogue
from nodeagent.errors import AllocationRejectedError
from nodeagent.health_book import DeviceHealthBook
from nodeagent.metrics import AgentMetrics
from nodeagent.podresources import AllocationLog
from nodeagent.state import ResourceState

log = logging.getLogger(__name__)

AGENT_FILE = "agent.json"
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


@dataclass(frozen=True)
class AgentConfig:
    kubelet_dir: Path
    state_dir: Path
    sharing: SharingPlan = field(default_factory=SharingPlan)
    poll_interval: float = 0.1
    rediscover_interval: float = 0.0  # seconds between periodic re-discoveries; 0: only on request
    device_listing: DeviceListing = field(default_factory=DeviceListing)  # how Allocate names devices
    # False in DRA mode (``gpuweave node-agent --dra``): the lists and health are kept as always, but
    # no device-plugin socket is served or registered, so the kubelet gets no resource from here
    serve_device_plugins: bool = True


@dataclass
class _Resource:
    state: ResourceState
    server: ResourceServer


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        discover: Callable[[], NodeInventory],
        chooser_for: Callable[[NodeInventory], GpuSetChooser | None] | None = None,
        handoff: HandoffSource | None = None,
        metrics: AgentMetrics | None = None,
        siblings: SiblingGrants | None = None,
        allocations: AllocationLog | None = None,
        cdi: CdiPublisher | None = None,
    ) -> None:
        self.config = config
        self.allocations = allocations or AllocationLog()
        self.claim_hook: Callable[[frozenset[str]], None] | None = None  # GPU UUIDs a pod is granted
        self.metrics = metrics or AgentMetrics()
        self.control = ControlServer(config.state_dir)
        self._discover = discover
        self._chooser_for = chooser_for
        self._handoff = handoff
        self._cdi = cdi  # CDI specs follow every change of the device lists (nodeagent.cdi)
        self._lock = threading.RLock()
        self._file_lock = threading.Lock()
        self._stopping = threading.Event()
        self._siblings = siblings or SiblingGrants()
        self._rediscover: threading.Thread | None = None
        self._prepare: threading.Thread | None = None
        self._resources: dict[str, _Resource] = {}
        self._health_book = DeviceHealthBook()  # faults, withheld devices, gates, lost GPUs
        self._listeners: list[Callable[[], None]] = []
        self._inventory: NodeInventory | None = None
        self._chooser: GpuSetChooser | None = None
        self._mps_pipes: MpsPipeLookup | None = None
        self._watcher = KubeletWatcher(
            config.kubelet_dir,
            servers=self._servers,
            poll_interval=config.poll_interval,
            on_registered=self._registered,
        )

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Serve every resource, then register (the watcher's first round), then open control."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self.refresh_inventory()
        self._add_builtin_routes()
        self.control.start()
        self._watcher.start()
        self._prepare = threading.Thread(target=self._prepare_chooser, name="chooser-prepare", daemon=True)
        self._prepare.start()
        if self.config.rediscover_interval > 0:
            self._rediscover = threading.Thread(
                target=self._rediscover_loop,
                args=(self.config.rediscover_interval,),
                name="rediscover",
                daemon=True,
            )
            self._rediscover.start()
        self._write_agent_file()

    def stop(self) -> None:
        self._stopping.set()
        for thread in (self._rediscover, self._prepare):
            if thread is not None:
                thread.join()
        self._watcher.stop()
        self.control.stop()
        with self._lock:
            resources = list(self._resources.values())
        for resource in resources:
            resource.server.stop()
        (self.config.state_dir / AGENT_FILE).unlink(missing_ok=True)

    # ---- inventory -------------------------------------------------------------------------
    @property
    def inventory(self) -> NodeInventory:
        if self._inventory is None:
            raise RuntimeError("agent not started: no inventory yet")
        return self._inventory

    def refresh_inventory(self) -> dict[str, int]:
        """Re-discover and update every resource in place; return device counts per resource."""
        inventory = self._discover()
        catalogue = build_catalogue(inventory, self.config.sharing)
        with self._lock:
            changed = inventory != self._inventory
            if changed:
                self._inventory = inventory
                self._health_book.follow_inventory(inventory)
                self._chooser = self._chooser_for(inventory) if self._chooser_for else None
            if self._cdi is not None:  # defined before any list can offer a new device
                self._cdi.prepare(inventory, [d for devices in catalogue.values() for d in devices])
            for name in catalogue.keys() - self._resources.keys():
                self._add_resource(name)
            for name in self._resources.keys() - catalogue.keys():
                catalogue[name] = ()
            changed = self._apply(catalogue) or changed
            if self._cdi is not None:  # removed devices leave the specs once no list offers them
                self._cdi.commit()
        if changed:
            self._changed()
        return {name: len(devices) for name, devices in catalogue.items()}

    def set_sharing(self, plan: SharingPlan) -> dict[str, int]:
        """Offer the GPUs under a new sharing plan (each resource's list updated in place)."""
        with self._lock:
            self.config = replace(self.config, sharing=plan)
        return self.refresh_inventory()

    def use_mps_pipes(self, lookup: MpsPipeLookup) -> None:
        """Grant each share its own GPU's MPS pipe directory (``nodeagent.mps``), not one for all."""
        self._mps_pipes = lookup

    @property
    def mps_pipes(self) -> str | MpsPipeLookup | None:
        """Where a share's grant takes its MPS pipe directory from: each GPU's live daemon, else the
        configured directory (Allocate here, NodePrepareResources in DRA mode)."""
        return self._mps_pipes or self.config.sharing.mps_pipe_directory

    def _prepare_chooser(self) -> None:
        """Prepare the topology chooser once registration is done, so neither start-up nor the
        first GetPreferredAllocation waits for it (a request before then prepares it itself)."""
        deadline = time.monotonic() + PREPARE_AFTER_S
        while time.monotonic() < deadline and not self._all_registered():
            if self._stopping.wait(self.config.poll_interval):
                return
        with self._lock:
            chooser = self._chooser
        if isinstance(chooser, PreparableChooser) and not self._stopping.is_set():
            chooser.prepare()

    def _all_registered(self) -> bool:
        registered = self._watcher.registered()
        return bool(registered) and all(registered.get(name, False) for name in self.resource_names())

    def _rediscover_loop(self, interval: float) -> None:
        """Periodic re-discovery (hot-plug, a GPU that fell off the bus, changes made behind our back)."""
        while not self._stopping.wait(interval):
            try:
                self.refresh_inventory()
            except Exception as exc:  # a failed discovery keeps the lists we have
                log.warning("re-discovery failed (%s); keeping the current device lists", exc)

    def _add_resource(self, name: str) -> None:
        state = ResourceState(name)
        service = DevicePluginService(
            state,
            prefer=self._prefer,
            grant=partial(self._grant, name),
            on_error=partial(self._preference_failed, name),
        )
        server = ResourceServer(service, resource=name, kubelet_dir=self.config.kubelet_dir)
        if self.config.serve_device_plugins:
            server.start()  # serving before the watcher registers it
        self._resources[name] = _Resource(state, server)

    def _apply(self, catalogue: dict[str, tuple[PluginDevice, ...]] | None = None) -> bool:
        """Push lists and health into every resource; True when any resource changed."""
        changed = False
        with self._lock:
            for name, resource in self._resources.items():
                devices = (
                    catalogue[name] if catalogue is not None else tuple(resource.state.devices().values())
                )
                reasons = self._health_book.reasons_for(devices)
                changed = resource.state.update(devices, reasons) or changed
                self.metrics.unhealthy_devices.labels(name).set(len(reasons))
        return changed

    # ---- health ----------------------------------------------------------------------------
    def set_device_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Record a device's (or a whole GPU's, by UUID) health; streams the change at once."""
        with self._lock:
            self._health_book.set_health(device_id, healthy, reason)
            self._apply()
        self._changed()

    def withhold(self, device_ids: Iterable[str], reason: str = "withheld") -> None:
        with self._lock:
            self._health_book.withhold(device_ids, reason)
            self._apply()
        self._changed()

    def release(self, device_ids: Iterable[str]) -> None:
        with self._lock:
            self._health_book.release(device_ids)
            self._apply()
        self._changed()

    def set_gate(self, name: str, reasons: Mapping[str, str]) -> None:
        """Withhold exactly ``reasons`` (device ID or GPU UUID -> reason) for one named node-level
        condition, such as the NVSwitch fabric; kept apart from ``withhold`` so that a MIG
        reshape's ``release`` of a GPU never lifts a gate on it."""
        with self._lock:
            if not self._health_book.set_gate(name, reasons):
                return
            self._apply()
        self._changed()

    def health_maps(self) -> tuple[dict[str, str], dict[str, str]]:
        """(faults, withheld): device ID or GPU UUID -> reason; withheld includes every gate's
        (the NVSwitch fabric), so what is published matches what the kubelet is told."""
        with self._lock:
            return self._health_book.faults(), self._health_book.withheld()

    def health_report(self) -> dict[str, Any]:
        """Per resource, every device's health and reason; plus the raw fault and withheld maps."""
        with self._lock:
            resources = {
                name: [
                    {"id": s.device.id, "health": s.health, "reason": s.reason} for s in r.state.snapshot()
                ]
                for name, r in self._resources.items()
            }
            faults, withheld = self._health_book.faults(), self._health_book.withheld_on_request()
            return {"resources": resources, "faults": faults, "withheld": withheld}

    # ---- kubelet-facing policy -------------------------------------------------------------
    def _prefer(self, request: PreferenceRequest) -> list[str]:
        with self._lock:
            resource = self._resources[request.resource]
            chooser = self._chooser
        devices = resource.state.devices()
        hint = self._handoff.hint(request, devices) if self._handoff is not None else None
        near = self._siblings.near(request.resource)
        return preferred_devices(request, devices=devices, gpu_chooser=chooser, hint=hint, near=near)

    def _preference_failed(self, resource_name: str, what: str, exc: BaseException) -> None:
        self.metrics.preferred_fallbacks.labels(resource_name).inc()

    def _grant(self, resource_name: str, device_ids: Sequence[str]) -> ContainerGrant:
        with self._lock:
            resource = self._resources[resource_name]
        self.allocations.record(device_ids)  # first: a check that withholds one after this sees it
        self._claim(resource, device_ids)
        try:
            grant = grant_for(
                resource_name,
                device_ids,
                devices=resource.state.devices(),
                unhealthy=resource.state.unhealthy(),
                mps_pipe_dir=self.mps_pipes,
                listing=self.config.device_listing,
            )
        except AllocationRejectedError:
            self.metrics.allocations.labels(resource_name, "rejected").inc()
            raise
        self.metrics.allocations.labels(resource_name, "granted").inc()
        granted = resource.state.devices()
        self._siblings.remember(resource_name, [granted[i] for i in device_ids if i in granted])
        if self._handoff is not None:
            self._handoff.observe_allocation(resource_name, list(device_ids))
        return grant

    def _claim(self, resource: _Resource, device_ids: Sequence[str]) -> None:
        """An active check on the GPUs behind ``device_ids`` lets go of them before this returns."""
        hook = self.claim_hook
        if hook is None:
            return
        devices = resource.state.devices()
        gpus = frozenset(
            uuid for uuid in (devices[i].gpu_uuid if i in devices else None for i in device_ids) if uuid
        )
        if gpus:
            try:
                hook(gpus)
            except Exception:  # never the kubelet's failure: the grant goes on
                log.exception("the active-check claim of %s failed", sorted(gpus))

    # ---- introspection ---------------------------------------------------------------------
    def _servers(self) -> list[ResourceServer]:
        if not self.config.serve_device_plugins:
            return []  # DRA mode: nothing for the kubelet's device manager
        with self._lock:
            return [r.server for r in self._resources.values()]

    def resource_names(self) -> list[str]:
        with self._lock:
            return sorted(self._resources)

    def state_of(self, resource: str) -> ResourceState:
        with self._lock:
            return self._resources[resource].state

    def registered(self) -> dict[str, bool]:
        return self._watcher.registered()

    def status(self) -> dict[str, Any]:
        registered = self._watcher.registered()
        with self._lock:
            resources = {
                name: {
                    "socket": str(r.server.socket_path),
                    "devices": len(r.state.devices()),
                    "unhealthy": len(r.state.unhealthy()),
                    "registered": registered.get(name, False),
                    "streams": r.state.stream_count,
                }
                for name, r in self._resources.items()
            }
        serving = self.config.serve_device_plugins
        return {
            "ready": bool(resources) and (not serving or all(r["registered"] for r in resources.values())),
            "device_plugins": serving,
            "pid": os.getpid(),
            "node": self._inventory.name if self._inventory else "",
            "kubelet_dir": str(self.config.kubelet_dir),
            "control_socket": str(self.control.socket_path),
            "resources": resources,
            "registration_counts": self._watcher.registration_counts(),
        }

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _registered(self, resource: str) -> None:
        self.metrics.registrations.labels(resource).inc()
        self._write_agent_file()

    def _changed(self) -> None:
        self._write_agent_file()
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("agent change listener failed")

    def _write_agent_file(self) -> None:
        """Write the status file for tools; a failed write (full disk) is logged, never raised:
        it must not stop a health push or a registration, and the next change writes it again."""
        with self._file_lock:
            try:
                if self.config.state_dir.exists():
                    write_json_atomically(self.config.state_dir / AGENT_FILE, self.status())
            except OSError as exc:
                log.warning(
                    "cannot write %s: %s; tools read a stale status until it is written again",
                    self.config.state_dir / AGENT_FILE,
                    exc,
                )

    def _add_builtin_routes(self) -> None:
        self.control.add_route("agent.status", lambda params: self.status())
        self.control.add_route("agent.refresh", lambda params: {"resources": self.refresh_inventory()})
        self.control.add_route("agent.health", lambda params: self.health_report())
        self.control.add_route("device.set_health", self._route_set_health)
        self.control.add_route("device.withhold", self._route_withhold)
        self.control.add_route("device.release", self._route_release)

    def _route_set_health(self, params: dict[str, Any]) -> dict[str, Any]:
        device_id, healthy = params.get("device"), params.get("healthy")
        if not isinstance(device_id, str) or not isinstance(healthy, bool):
            raise AllocationRejectedError('device.set_health needs {"device": str, "healthy": bool}')
        self.set_device_health(device_id, healthy, str(params.get("reason", "")))
        return self.health_report()

    def _route_withhold(self, params: dict[str, Any]) -> dict[str, Any]:
        self.withhold(_id_list(params), str(params.get("reason", "withheld")))
        return self.health_report()

    def _route_release(self, params: dict[str, Any]) -> dict[str, Any]:
        self.release(_id_list(params))
        return self.health_report()


def _id_list(params: dict[str, Any]) -> list[str]:
    ids = params.get("devices")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise AllocationRejectedError('expected {"devices": [str, ...]}')
    return ids
