"""The agent's local control socket: newline-delimited JSON over ``STATE_DIR/agent.sock``.

One request per connection: ``{"method": "mig.apply", "params": {...}}`` answered by
``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "...", "code": "bad_request"}``.
Parts of the agent add their own commands with ``ControlServer.add_route`` (the MIG manager adds
``mig.apply``, fault injection adds ``sim.inject``); ``call_agent`` is the client for tools and tests.
The socket is mode 0600: only the node's root (the agent's user) may steer the agent.
Connections go through ``netio.gate`` (``CONTROL_LIMITS``), the bounds every gpuweave listener
shares: a client must send its whole request line within ``REQUEST_DEADLINE_S``, so idle or slow
clients hold no worker at all and a connection for at most that long, and every request line
that is not a request (not UTF-8, not JSON, too deep, too long, late) still gets the documented
``bad_request`` answer before the close. At most ``MAX_CONNECTIONS`` connections are open at
once; one more is answered ``busy`` at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from netio.gate import Gate, GateLimits, Refusal, line_end
from nodeagent.errors import ControlError

log = logging.getLogger(__name__)

CONTROL_SOCKET = "agent.sock"
MAX_REQUEST_BYTES = 1 << 20
REQUEST_DEADLINE_S = 2.0  # for the whole request line: a local tool sends it at once
MAX_CONNECTIONS = 16  # open at once; one more is answered busy
CONTROL_LIMITS = GateLimits(
    max_connections=MAX_CONNECTIONS,
    deadline_s=REQUEST_DEADLINE_S,
    max_head_bytes=MAX_REQUEST_BYTES + 1,  # the line and its newline
    workers=4,
)
Params = dict[str, Any]
Route = Callable[[Params], dict[str, Any]]


def _encode(response: dict[str, Any]) -> bytes:
    return json.dumps(response).encode() + b"\n"


def _refusal(why: Refusal) -> bytes:
    """The answer to a connection the gate refuses, in the protocol's own form."""
    if why is Refusal.BUSY:
        error = f"the control socket already holds {MAX_CONNECTIONS} connections; retry in a few seconds"
        return _encode({"ok": False, "error": error, "code": "busy"})
    if why is Refusal.LATE:
        error = f"no whole request line within {REQUEST_DEADLINE_S:g} s"
    else:
        error = f"request larger than {MAX_REQUEST_BYTES} bytes"
    return _encode({"ok": False, "error": error, "code": "bad_request"})


class ControlServer:
    """Serves registered routes on a unix socket; each request runs on a small worker pool."""

    def __init__(self, state_dir: Path) -> None:
        self.socket_path = state_dir / CONTROL_SOCKET
        self._routes: dict[str, Route] = {}
        self._routes_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._gate: Gate | None = None

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
        listener.listen(64)
        self._listener = listener
        self._gate = Gate(
            listener,
            name="control",
            limits=CONTROL_LIMITS,
            head_end=line_end,
            serve=self._answer_line,
            refuse=_refusal,
        )
        self._gate.start()

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.stop(wait=True)
        if self._listener is not None:
            self._listener.close()
        self.socket_path.unlink(missing_ok=True)

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

    def _answer_line(self, head: bytes) -> bytes:
        """The answer line to one request line (``head``, its newline included when it came)."""
        line = head.split(b"\n", 1)[0]
        try:
            request = json.loads(line)
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
            return _encode({"ok": False, "error": f"request is not JSON: {exc}", "code": "bad_request"})
        return _encode(self.dispatch(request))


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
        except OSError as exc:
            raise ControlError(
                f"cannot reach the node agent at {path}: {exc}; is `gpuweave node-agent` running?",
                code="unavailable",
            ) from exc
        send_request(conn, json.dumps({"method": method, "params": params or {}}).encode() + b"\n")
        line = _answer(conn, method=method, path=path, timeout=timeout)
    response = _decode_answer(line, method=method, path=path)
    if not response.get("ok"):
        raise ControlError(
            f"{method}: {response.get('error')}", code=str(response.get("code", "bad_request"))
        )
    result = response.get("result")
    return result if isinstance(result, dict) else {"value": result}


def send_request(conn: socket.socket, line: bytes) -> None:
    """Send one request line on a connected socket. The agent may answer without reading it (a
    ``busy`` refusal is written and the connection closed the moment it is accepted), so a send
    that finds the agent's side closed is not an error here: its answer is already queued on this
    socket, and reading it says what happened (``busy``), or, if nothing is there, that the agent
    went away (``lost``)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        conn.sendall(line)


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
