"""The agent's local control socket: newline-delimited JSON over ``STATE_DIR/agent.sock``.

One request per connection: ``{"method": "mig.apply", "params": {...}}`` answered by
``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "...", "code": "bad_request"}``.
Parts of the agent add their own commands with ``ControlServer.add_route`` (the MIG manager adds
``mig.apply``, fault injection adds ``sim.inject``); ``call_agent`` is the client for tools and tests.
The socket is mode 0600: only the node's root (the agent's user) may steer the agent.
A client must send its whole request line within ``REQUEST_DEADLINE_S``, so idle or slow clients
hold a worker for at most that long, and every request line that is not a request (not UTF-8, not
JSON, too deep, too long, late) still gets the documented ``bad_request`` answer before the close.
At most ``MAX_CONNECTIONS`` connections are served or queued; one more is answered ``busy`` at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from deviceplugin.errors import ControlError

log = logging.getLogger(__name__)

CONTROL_SOCKET = "agent.sock"
MAX_REQUEST_BYTES = 1 << 20
REQUEST_DEADLINE_S = 2.0  # for the whole request line: a local tool sends it at once
MAX_CONNECTIONS = 16  # served or queued at once; one more is answered busy
ANSWER_TIMEOUT_S = 30.0  # for the answer to be taken
Params = dict[str, Any]
Route = Callable[[Params], dict[str, Any]]


def _read_line(conn: socket.socket, *, deadline_s: float = REQUEST_DEADLINE_S) -> bytes:
    """The request line, which must arrive whole within ``deadline_s`` (not per read: a client
    sending a byte at a time gets no longer)."""
    data = bytearray()
    until = time.monotonic() + deadline_s
    while b"\n" not in data:
        left = until - time.monotonic()
        if left <= 0:
            raise ControlError(f"no whole request line within {deadline_s:g} s")
        conn.settimeout(left)
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            raise ControlError(f"no whole request line within {deadline_s:g} s") from None
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise ControlError(f"request larger than {MAX_REQUEST_BYTES} bytes")
    return bytes(data).split(b"\n", 1)[0]


def _answer_busy(conn: socket.socket) -> None:
    """Answer a connection beyond ``MAX_CONNECTIONS`` at once, from the accept thread."""
    busy = {
        "ok": False,
        "error": f"the control socket already holds {MAX_CONNECTIONS} connections; retry in a few seconds",
        "code": "busy",
    }
    with conn:
        conn.settimeout(0.1)  # a few bytes fit the socket buffer; never wait on the client
        with contextlib.suppress(OSError):  # a client gone already needs no answer
            conn.sendall(json.dumps(busy).encode() + b"\n")


class ControlServer:
    """Serves registered routes on a unix socket; each request runs on a small worker pool."""

    def __init__(self, state_dir: Path) -> None:
        self.socket_path = state_dir / CONTROL_SOCKET
        self._routes: dict[str, Route] = {}
        self._routes_lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="control")
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)  # served or queued connections

    def add_route(self, method: str, handler: Route) -> None:
        """Add a command; ``handler(params)`` returns a JSON-able dict or raises ``GpuweaveError``."""
        with self._routes_lock:
            if method in self._routes:
                raise ControlError(f"control method {method!r} is already registered", code="conflict")
            self._routes[method] = handler

    def methods(self) -> list[str]:
        with self._routes_lock:
            return sorted(self._routes)

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        listener.listen(16)
        listener.settimeout(0.2)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="control-accept", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._listener is not None:
            self._listener.close()
        self._workers.shutdown(wait=True)
        self.socket_path.unlink(missing_ok=True)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            if self._slots.acquire(blocking=False):
                self._workers.submit(self._serve_slot, conn)
            else:
                _answer_busy(conn)

    def _serve_slot(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        finally:
            self._slots.release()

    def dispatch(self, request: object) -> dict[str, Any]:
        """Answer one decoded request (also usable in-process)."""
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return {
                "ok": False,
                "error": 'request must be {"method": str, "params": object}',
                "code": "bad_request",
            }
        params = request.get("params") or {}
        if not isinstance(params, dict):
            return {"ok": False, "error": "params must be a JSON object", "code": "bad_request"}
        method = request["method"]
        with self._routes_lock:
            handler = self._routes.get(method)
        if handler is None:
            return {
                "ok": False,
                "error": f"unknown method {method!r}; known: {self.methods()}",
                "code": "not_found",
            }
        try:
            return {"ok": True, "result": handler(params)}
        except ControlError as exc:
            return {"ok": False, "error": str(exc), "code": exc.code}
        except GpuweaveError as exc:
            return {"ok": False, "error": str(exc), "code": "bad_request"}
        except Exception as exc:
            log.exception("control method %s failed", method)
            return {"ok": False, "error": f"{method} failed: {exc}", "code": "internal"}

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                line = _read_line(conn)
                try:
                    request = json.loads(line)
                except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
                    response = {"ok": False, "error": f"request is not JSON: {exc}", "code": "bad_request"}
                else:
                    response = self.dispatch(request)
            except (ControlError, OSError) as exc:
                response = {"ok": False, "error": str(exc), "code": "bad_request"}
            conn.settimeout(ANSWER_TIMEOUT_S)
            try:
                conn.sendall(json.dumps(response).encode() + b"\n")
            except OSError:
                log.warning("control client went away before the answer")


def call_agent(
    state_dir: Path | str, method: str, params: Params | None = None, *, timeout: float = 30.0
) -> dict[str, Any]:
    """Call a running agent's control method; return its result or raise ``ControlError``.

    Every way the agent can fail the caller is one ``ControlError`` with one line of text: not
    listening (``unavailable``), gone before it answered, e.g. killed mid-reshape (``lost``), no
    answer in ``timeout`` (``timeout``), or an answer that is not the protocol (``internal``).
    """
    path = Path(state_dir) / CONTROL_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(path))
            conn.sendall(json.dumps({"method": method, "params": params or {}}).encode() + b"\n")
        except OSError as exc:
            raise ControlError(
                f"cannot reach the node agent at {path}: {exc}; is `gpuweave node-agent` running?",
                code="unavailable",
            ) from exc
        line = _answer(conn, method=method, path=path, timeout=timeout)
    response = _decode_answer(line, method=method, path=path)
    if not response.get("ok"):
        raise ControlError(
            f"{method}: {response.get('error')}", code=str(response.get("code", "bad_request"))
        )
    result = response.get("result")
    return result if isinstance(result, dict) else {"value": result}


def _answer(conn: socket.socket, *, method: str, path: Path, timeout: float) -> bytes:
    """The agent's answer line; a connection closed or reset before it is a lost agent."""
    lost = (
        f"{method}: the node agent at {path} went away before answering (it exited or was killed "
        "mid-request); what it finished is in its journal: check its log, restart it and retry"
    )
    try:
        data = _read_until_newline(conn)
    except TimeoutError as exc:
        raise ControlError(
            f"{method}: no answer from the node agent at {path} within {timeout:g} s; "
            "it may still be working: check its log, or retry with a longer --timeout",
            code="timeout",
        ) from exc
    except OSError as exc:  # reset by the peer: the agent's process ended
        raise ControlError(lost, code="lost") from exc
    if data is None:  # end of stream before a whole line: nothing, or half an answer
        raise ControlError(lost, code="lost")
    return data


def _read_until_newline(conn: socket.socket) -> bytes | None:
    """One answer line, or None when the stream ends before its newline."""
    data = bytearray()
    while b"\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise ControlError(f"answer larger than {MAX_REQUEST_BYTES} bytes")
    return bytes(data).split(b"\n", 1)[0]


def _decode_answer(line: bytes, *, method: str, path: Path) -> dict[str, Any]:
    try:
        response = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ControlError(
            f"{method}: the node agent at {path} sent an answer that is not JSON ({exc}); "
            "is another program listening on its socket?",
            code="internal",
        ) from exc
    if not isinstance(response, dict):
        raise ControlError(
            f"{method}: the node agent at {path} sent {type(response).__name__}, not an object",
            code="internal",
        )
    return response
