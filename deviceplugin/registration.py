"""Registration with the kubelet, and the watcher that re-registers after a kubelet restart.

The kubelet deletes every socket in its device-plugin directory when it starts and then
listens on a new ``kubelet.sock``. The watcher polls (every ``poll_interval``, 0.1 s) the inode
of ``kubelet.sock`` and of each of our sockets: a deleted socket is rebound on the same path,
and a new ``kubelet.sock`` inode or a rebound socket triggers a new ``Register`` with the same
resource and device IDs. Polling inodes needs no inotify and catches a delete+create pair that a
single file event can miss.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from deviceplugin.server import DevicePluginService, ResourceServer
from nodeagent.errors import DevicePluginError
from proto.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT_S = 5.0
RETRY_AFTER_S = 1.0


def register(
    kubelet_socket: Path, *, endpoint: str, resource: str, timeout: float = REGISTER_TIMEOUT_S
) -> None:
    """Call ``Registration.Register`` on the kubelet; raise ``DevicePluginError`` naming the cause."""
    request = api_pb2.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource, options=DevicePluginService.options()
    )
    with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
        try:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise DevicePluginError(
                f"kubelet at {kubelet_socket} refused {resource} ({endpoint}): {code}: {details}; retrying"
            ) from exc


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


@dataclass
class _Registration:
    kubelet_inode: int | None = None  # kubelet.sock inode we last registered with
    retry_at: float = 0.0
    registered: bool = False
    count: int = field(default=0)


class KubeletWatcher:
    """Keeps every resource server bound and registered with the current kubelet."""

    def __init__(
        self,
        kubelet_dir: Path,
        *,
        servers: Callable[[], list[ResourceServer]],
        poll_interval: float = 0.1,
        on_registered: Callable[[str], None] | None = None,
    ) -> None:
        self.kubelet_socket = kubelet_dir / KUBELET_SOCKET
        self._servers = servers
        self._poll_interval = poll_interval
        self._on_registered = on_registered
        self._state: dict[str, _Registration] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kubelet-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def registration_counts(self) -> dict[str, int]:
        with self._lock:
            return {name: reg.count for name, reg in self._state.items()}

    def registered(self) -> dict[str, bool]:
        with self._lock:
            return {name: reg.registered for name, reg in self._state.items()}

    def forget(self, resource: str) -> None:
        with self._lock:
            self._state.pop(resource, None)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_once()
            except Exception:  # the watcher must outlive any one bad round
                log.exception("kubelet watcher round failed")
            self._stop.wait(self._poll_interval)

    def check_once(self) -> None:
        """One polling round: rebind deleted sockets, register where the kubelet is new."""
        kubelet_inode = _inode(self.kubelet_socket)
        for server in self._servers():
            with self._lock:
                reg = self._state.setdefault(server.resource, _Registration())
            if not server.socket_alive():
                log.warning("socket %s was deleted; rebinding", server.socket_path)
                server.start()
                reg.registered = False
            if kubelet_inode is None:
                reg.registered = False
                continue
            if reg.registered and reg.kubelet_inode == kubelet_inode:
                continue
            self._try_register(server, reg, kubelet_inode)

    def _try_register(self, server: ResourceServer, reg: _Registration, kubelet_inode: int) -> None:
        now = time.monotonic()
        if reg.kubelet_inode == kubelet_inode and now < reg.retry_at:
            return
        reg.kubelet_inode = kubelet_inode
        try:
            register(self.kubelet_socket, endpoint=server.endpoint, resource=server.resource)
        except DevicePluginError as exc:
            log.warning("%s", exc)
            reg.retry_at = now + RETRY_AFTER_S
            return
        with self._lock:
            reg.registered = True
            reg.count += 1
        log.info("registered %s with the kubelet as %s", server.resource, server.endpoint)
        if self._on_registered is not None:
            self._on_registered(server.resource)
