"""The node agent's core: inventory, every resource's device list and health, the control socket.

``NodeAgent`` is the in-process API the rest of the node talks to, whichever front end serves its
devices to the kubelet (``deviceplugin.frontend``, or none here in DRA mode, where ``dradriver`` is
composed beside it by ``gpuweave.node.dra``):

- ``refresh_inventory()`` re-discovers hardware (after a MIG reshape or a hot-plug) and updates
  each resource's list in place; a new resource name is handed to the front end (its own server,
  socket and registration); a resource that lost every device streams an empty list; nothing else
  restarts.
- ``set_device_health(device_id, healthy, reason)`` records a fault on a device ID or on a
  physical GPU UUID (which fans out to that GPU's MIG devices and shares, never to siblings).
- ``withhold(ids, reason)`` / ``release(ids)``: devices reported Unhealthy so the kubelet stops
  placing new work there (the Suspect state of the health design), without calling them failed;
  ``set_gate(name, reasons)`` does the same for a named node-level condition (the NVSwitch fabric).
  The bookkeeping behind these (faults, withheld devices, gates, lost GPUs) is
  ``nodeagent.health_book.DeviceHealthBook``; the agent pushes its verdicts into every list
  and streams the change.
- ``set_degraded_links(links)``: the NVLink pairs health's active checks found slow; no device
  is withheld for them, they are published (``status.degradedLinks``) so the extender's set choice
  avoids spanning them.
- ``control.add_route(method, handler)`` adds a command to ``STATE_DIR/agent.sock``.
- ``add_listener(fn)`` calls ``fn()`` after every change (the publisher uses it).
- ``allocations`` holds the device IDs granted since start, with when (a second source of "held by
  a pod" next to the kubelet's pod-resources API).
- ``claim_hook`` (health's active checks) is told the GPUs of every grant, after the grant is
  recorded in ``allocations`` and before it is validated: a check running on one of them lets go
  of it first, so a pod the kubelet admitted before a check's withholding reached it still gets
  its GPU (``health.active_claims``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from devicemodel.inventory import DegradedLink, NodeInventory
from devicemodel.sharing import SharingPlan
from devicemodel.state_file import write_json_atomically
from nodeagent.allocation import DeviceListing, MpsPipeLookup
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


@dataclass(frozen=True)
class AgentConfig:
    kubelet_dir: Path
    state_dir: Path
    sharing: SharingPlan = field(default_factory=SharingPlan)
    poll_interval: float = 0.1
    rediscover_interval: float = 0.0  # seconds between periodic re-discoveries; 0: only on request
    device_listing: DeviceListing = field(default_factory=DeviceListing)  # how a grant names devices
    # False in DRA mode (``gpuweave node-agent --dra``): the lists and health are kept as always, but
    # no device-plugin front end is attached, so the kubelet gets no resource from here
    serve_device_plugins: bool = True


class FrontEnd(Protocol):
    """What serves the agent's per-resource lists to the kubelet (``deviceplugin.frontend``): told
    of each new resource and of each new inventory, started after the first lists are known."""

    def add_resource(self, name: str, state: ResourceState) -> None: ...

    def inventory_changed(self, inventory: NodeInventory) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def socket_of(self, resource: str) -> str: ...

    def registered(self) -> dict[str, bool]: ...

    def registration_counts(self) -> dict[str, int]: ...


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        discover: Callable[[], NodeInventory],
        metrics: AgentMetrics | None = None,
        allocations: AllocationLog | None = None,
        cdi: CdiPublisher | None = None,
    ) -> None:
        self.config = config
        self.allocations = allocations or AllocationLog()
        self.claim_hook: Callable[[frozenset[str]], None] | None = None  # GPU UUIDs a pod is granted
        self.metrics = metrics or AgentMetrics()
        self.control = ControlServer(config.state_dir)
        self._discover = discover
        self._cdi = cdi  # CDI specs follow every change of the device lists (nodeagent.cdi)
        self._lock = threading.RLock()
        self._file_lock = threading.Lock()
        self._stopping = threading.Event()
        self._rediscover: threading.Thread | None = None
        self._resources: dict[str, ResourceState] = {}
        self._health_book = DeviceHealthBook()  # faults, withheld devices, gates, lost GPUs
        self._degraded: tuple[DegradedLink, ...] = ()  # NVLink pairs found slow (published only)
        self._listeners: list[Callable[[], None]] = []
        self._inventory: NodeInventory | None = None
        self._mps_pipes: MpsPipeLookup | None = None
        self._front_end: FrontEnd | None = None

    def attach(self, front_end: FrontEnd) -> None:
        """Serve the lists through ``front_end`` (before ``start``; one front end per agent)."""
        if self._front_end is not None:
            raise RuntimeError("a front end is attached already")
        self._front_end = front_end

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Build every list, open control, then start the front end (its servers register)."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self.refresh_inventory()
        self._add_builtin_routes()
        self.control.start()
        if self._front_end is not None:
            self._front_end.start()
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
        if self._rediscover is not None:
            self._rediscover.join()
        self.control.stop()
        if self._front_end is not None:
            self._front_end.stop()
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
                if self._front_end is not None:
                    self._front_end.inventory_changed(inventory)
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
        configured directory (Allocate in device-plugin mode, NodePrepareResources in DRA mode)."""
        return self._mps_pipes or self.config.sharing.mps_pipe_directory

    def _rediscover_loop(self, interval: float) -> None:
        """Periodic re-discovery (hot-plug, a GPU that fell off the bus, changes made behind our back)."""
        while not self._stopping.wait(interval):
            try:
                self.refresh_inventory()
            except Exception as exc:  # a failed discovery keeps the lists we have
                log.warning("re-discovery failed (%s); keeping the current device lists", exc)

    def _add_resource(self, name: str) -> None:
        state = ResourceState(name)
        if self._front_end is not None:
            self._front_end.add_resource(name, state)  # served before it is registered
        self._resources[name] = state

    def _apply(self, catalogue: dict[str, tuple[PluginDevice, ...]] | None = None) -> bool:
        """Push lists and health into every resource; True when any resource changed."""
        changed = False
        with self._lock:
            for name, state in self._resources.items():
                devices = catalogue[name] if catalogue is not None else tuple(state.devices().values())
                reasons = self._health_book.reasons_for(devices)
                changed = state.update(devices, reasons) or changed
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

    def set_degraded_links(self, links: Iterable[DegradedLink]) -> None:
        """The NVLink pairs health's active checks found slow now (all of them: a pair left out
        is no longer degraded); listeners hear of a change (the publisher republishes)."""
        links = tuple(sorted(links, key=lambda link: sorted(link.pair)))
        with self._lock:
            if links == self._degraded:
                return
            self._degraded = links
        self._changed()

    def degraded_links(self) -> tuple[DegradedLink, ...]:
        with self._lock:
            return self._degraded

    def health_maps(self) -> tuple[dict[str, str], dict[str, str]]:
        """(faults, withheld): device ID or GPU UUID -> reason; withheld includes every gate's
        (the NVSwitch fabric), so what is published matches what the kubelet is told."""
        with self._lock:
            return self._health_book.faults(), self._health_book.withheld()

    def health_report(self) -> dict[str, Any]:
        """Per resource, every device's health and reason; plus the raw fault and withheld maps."""
        with self._lock:
            resources = {
                name: [{"id": s.device.id, "health": s.health, "reason": s.reason} for s in state.snapshot()]
                for name, state in self._resources.items()
            }
            faults, withheld = self._health_book.faults(), self._health_book.withheld_on_request()
            return {"resources": resources, "faults": faults, "withheld": withheld}

    # ---- introspection ---------------------------------------------------------------------
    def resource_names(self) -> list[str]:
        with self._lock:
            return sorted(self._resources)

    def state_of(self, resource: str) -> ResourceState:
        with self._lock:
            return self._resources[resource]

    def registered(self) -> dict[str, bool]:
        """Per resource, whether the front end registered it with the kubelet (none: nothing)."""
        return self._front_end.registered() if self._front_end is not None else {}

    def status(self) -> dict[str, Any]:
        front = self._front_end
        registered = self.registered()
        with self._lock:
            resources = {
                name: {
                    "socket": front.socket_of(name) if front is not None else "",
                    "devices": len(state.devices()),
                    "unhealthy": len(state.unhealthy()),
                    "registered": registered.get(name, False),
                    "streams": state.stream_count,
                }
                for name, state in self._resources.items()
            }
        serving = front is not None
        return {
            "ready": bool(resources) and (not serving or all(r["registered"] for r in resources.values())),
            "device_plugins": serving,
            "pid": os.getpid(),
            "node": self._inventory.name if self._inventory else "",
            "kubelet_dir": str(self.config.kubelet_dir),
            "control_socket": str(self.control.socket_path),
            "resources": resources,
            "registration_counts": front.registration_counts() if front is not None else {},
        }

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def write_status(self) -> None:
        """Write ``STATE_DIR/agent.json`` again (the front end calls it after a registration)."""
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
