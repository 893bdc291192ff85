"""One resource's live device list, shared by its gRPC servicer and the agent.

The agent replaces the list and the health map; every open ListAndWatch stream has its own
wake-up queue and sends the complete list after each change. Updates that change nothing are
not streamed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodeagent.devices import PluginDevice

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class DeviceStatus:
    device: PluginDevice
    health: str  # HEALTHY or UNHEALTHY
    reason: str = ""


class ResourceState:
    """Thread-safe device list of one resource with per-stream change notification."""

    def __init__(self, resource: str, devices: Sequence[PluginDevice] = ()) -> None:
        self.resource = resource
        self._lock = threading.Lock()
        self._devices: dict[str, PluginDevice] = {d.id: d for d in devices}
        self._unhealthy: dict[str, str] = {}
        self._watchers: set[queue.SimpleQueue[bool]] = set()
        self._generation = 0

    def update(self, devices: Sequence[PluginDevice], unhealthy: Mapping[str, str]) -> bool:
        """Replace the list and health; wake the streams when anything changed."""
        new_devices = {d.id: d for d in devices}
        new_unhealthy = {k: v for k, v in unhealthy.items() if k in new_devices}
        with self._lock:
            changed = new_devices != self._devices or new_unhealthy.keys() != self._unhealthy.keys()
            self._devices, self._unhealthy = new_devices, new_unhealthy
            if changed:
                self._generation += 1
                for watcher in self._watchers:
                    watcher.put(True)
        return changed

    def devices(self) -> dict[str, PluginDevice]:
        with self._lock:
            return dict(self._devices)

    def unhealthy(self) -> dict[str, str]:
        with self._lock:
            return dict(self._unhealthy)

    def snapshot(self) -> list[DeviceStatus]:
        with self._lock:
            return [
                DeviceStatus(
                    d, UNHEALTHY if d.id in self._unhealthy else HEALTHY, self._unhealthy.get(d.id, "")
                )
                for d in sorted(self._devices.values(), key=lambda d: d.id)
            ]

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def subscribe(self) -> queue.SimpleQueue[bool]:
        """A queue that receives True on every change and False when the stream must end."""
        watcher: queue.SimpleQueue[bool] = queue.SimpleQueue()
        with self._lock:
            self._watchers.add(watcher)
        return watcher

    def unsubscribe(self, watcher: queue.SimpleQueue[bool]) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def end_streams(self) -> None:
        """Tell every open ListAndWatch stream to finish (the server is going away)."""
        with self._lock:
            for watcher in self._watchers:
                watcher.put(False)

    @property
    def stream_count(self) -> int:
        with self._lock:
            return len(self._watchers)
