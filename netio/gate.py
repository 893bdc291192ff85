"""One bounded way to take requests on a listening socket: every listener gpuweave opens to clients
it does not control goes through it (the node agent's control socket, the extender's probe port,
the node agent's metrics port).

A thread per connection lets any client that connects, then sends slowly, hold a thread for as
long as it likes: 2,000 such clients held 973 threads of a ``ThreadingHTTPServer``. Here:

- one thread, the gate, accepts every connection and reads its request head without blocking
  (``selectors``): a slow client costs a socket and a buffer, never a thread;
- the head must arrive whole within ``deadline_s`` of the accept (for the whole head, not per
  read: a byte a second gets no longer) and be at most ``max_head_bytes``; else the listener's
  answer for that (``Refusal.LATE``, ``Refusal.TOO_LARGE``) is sent and the connection closed;
- at most ``max_connections`` connections are open at once, from accept to close. One more is
  answered ``Refusal.BUSY`` and closed at once; with ``displace`` it instead takes the place of
  the oldest connection still sending its head (that one gets ``BUSY``), so clients that send
  their request at once (the kubelet's probes) are served however many slow ones arrive;
- a whole head is answered by a pool of ``workers`` threads: ``serve(head)`` returns the answer,
  which is written (``ANSWER_TIMEOUT_S`` for the client to take it) before the close. One request
  per connection.

Answers to refused connections are written from the gate without waiting (they fit a fresh
socket's buffer; a client that takes nothing loses its answer, not our time).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 30.0  # for a client to take its answer
TICK_S = 0.2  # the gate looks at its deadlines and its stop flag at least this often
DRAIN_BYTES = 1 << 20  # read and dropped before a close, so the kernel sends FIN, not RST


class Refusal(enum.Enum):
    BUSY = "busy"  # the connection cap is reached
    LATE = "late"  # no whole head within the deadline
    TOO_LARGE = "too-large"  # the head grew past its limit


@dataclass(frozen=True)
class GateLimits:
    max_connections: int  # open at once, accept to close
    deadline_s: float  # for the whole request head, from the accept
    max_head_bytes: int
    workers: int  # threads answering whole heads
    displace: bool = False  # at the cap, a new connection displaces the oldest still sending its head


HeadEnd = Callable[[bytearray, int], int]  # (data so far, where to look from) -> index past the head, or -1
Serve = Callable[[bytes], bytes]  # a whole head -> the answer
Refuse = Callable[[Refusal], bytes]  # why a connection is refused -> its answer


@dataclass
class _Pending:
    conn: socket.socket
    until: float
    data: bytearray
    scanned: int = 0


class Gate:
    """Serves one listening socket (bound and listening; the gate makes it non-blocking)."""

    def __init__(
        self,
        listener: socket.socket,
        *,
        name: str,
        limits: GateLimits,
        head_end: HeadEnd,
        serve: Serve,
        refuse: Refuse,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._listener = listener
        self._name = name
        self.limits = limits
        self._head_end, self._serve, self._refuse = head_end, serve, refuse
        self._clock = clock
        self._pending: OrderedDict[int, _Pending] = OrderedDict()  # by fd, in accept order
        self._open = 0  # pending + being answered
        self._open_lock = threading.Lock()
        self._stop = threading.Event()
        self._workers = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix=f"{name}-worker")
        self._thread = threading.Thread(target=self._run, name=f"{name}-gate", daemon=True)

    def start(self) -> None:
        self._listener.setblocking(False)
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop accepting, close what is still sending its head; ``wait``: for answers under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._workers.shutdown(wait=wait)

    def open_connections(self) -> int:
        with self._open_lock:
            return self._open

    # ---- the gate thread -------------------------------------------------------------------------
    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ, None)
            try:
                while not self._stop.is_set():
                    for key, _ in selector.select(self._wait_s()):
                        if key.data is None:
                            self._accept(selector)
                        else:
                            self._read(selector, key.data)
                    self._expire(selector)
            finally:
                for pending in list(self._pending.values()):
                    self._drop(selector, pending, answer=None)

    def _wait_s(self) -> float:
        if not self._pending:
            return TICK_S
        first = next(iter(self._pending.values()))
        return max(0.0, min(TICK_S, first.until - self._clock()))

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: wait, the listener stays readable
                log.warning("%s: accept failed: %s", self._name, exc)
                self._stop.wait(TICK_S)
                return
            conn.setblocking(False)
            if not self._take_place(selector):
                _send_now(conn, self._refuse(Refusal.BUSY))
                _close(conn)
                continue
            self._pending[conn.fileno()] = _Pending(conn, self._clock() + self.limits.deadline_s, bytearray())
            selector.register(conn, selectors.EVENT_READ, conn.fileno())

    def _take_place(self, selector: selectors.BaseSelector) -> bool:
        """One more open connection, if the cap allows, or if it may displace the oldest head."""
        with self._open_lock:
            if self._open < self.limits.max_connections:
                self._open += 1
                return True
        if not (self.limits.displace and self._pending):
            return False
        oldest = next(iter(self._pending.values()))
        self._drop(selector, oldest, answer=Refusal.BUSY)  # its place passes to the newcomer
        with self._open_lock:
            self._open += 1
        return True

    def _read(self, selector: selectors.BaseSelector, fd: int) -> None:
        pending = self._pending.get(fd)
        if pending is None:
            return
        try:
            chunk = pending.conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client is done sending: what it sent is its request, or nothing
            if pending.data:
                self._hand_over(selector, pending, len(pending.data))
            else:
                self._drop(selector, pending, answer=None)
            return
        pending.data += chunk
        end = self._head_end(pending.data, pending.scanned)
        if 0 <= end <= self.limits.max_head_bytes:
            self._hand_over(selector, pending, end)
        elif len(pending.data) > self.limits.max_head_bytes:
            self._drop(selector, pending, answer=Refusal.TOO_LARGE)
        else:
            pending.scanned = len(pending.data)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = self._clock()
        while self._pending:
            first = next(iter(self._pending.values()))
            if first.until > now:
                return
            self._drop(selector, first, answer=Refusal.LATE)

    def _forget(self, selector: selectors.BaseSelector, pending: _Pending) -> None:
        del self._pending[pending.conn.fileno()]
        selector.unregister(pending.conn)

    def _drop(self, selector: selectors.BaseSelector, pending: _Pending, *, answer: Refusal | None) -> None:
        self._forget(selector, pending)
        if answer is not None:
            _send_now(pending.conn, self._refuse(answer))
        _close(pending.conn)
        self._release()

    def _hand_over(self, selector: selectors.BaseSelector, pending: _Pending, end: int) -> None:
        self._forget(selector, pending)
        self._workers.submit(self._answer, pending.conn, bytes(pending.data[:end]))

    def _release(self) -> None:
        with self._open_lock:
            self._open -= 1

    # ---- a worker --------------------------------------------------------------------------------
    def _answer(self, conn: socket.socket, head: bytes) -> None:
        try:
            answer = self._serve(head)
            conn.settimeout(ANSWER_TIMEOUT_S)
            conn.sendall(answer)
        except OSError:
            log.info("%s: the client went away before its answer", self._name)
        except Exception:  # a bug costs this connection, never the listener
            log.exception("%s: answering a request failed", self._name)
        finally:
            _close(conn)
            self._release()


def _send_now(conn: socket.socket, answer: bytes) -> None:
    """Write a short answer without waiting; a client that cannot take it now goes without."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(answer)


def _close(conn: socket.socket) -> None:
    """Close after the answer: end our side, drop what the client already sent (so the kernel
    closes with FIN, and the answer is not lost to a reset), close."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.setblocking(False)
        left = DRAIN_BYTES
        while left > 0 and (chunk := conn.recv(min(left, 65536))):
            left -= len(chunk)
    conn.close()


def line_end(data: bytearray, start: int) -> int:
    """Index past the first newline (a one-line request), or -1."""
    found = data.find(b"\n", start)
    return found + 1 if found >= 0 else -1


def http_head_end(data: bytearray, start: int) -> int:
    """Index past the empty line that ends an HTTP/1.x head (CRLF or bare LF lines), or -1."""
    crlf = data.find(b"\n\r\n", max(0, start - 2))
    lf = data.find(b"\n\n", max(0, start - 1))
    ends = [i + 3 for i in (crlf,) if i >= 0] + [i + 2 for i in (lf,) if i >= 0]
    return min(ends) if ends else -1
