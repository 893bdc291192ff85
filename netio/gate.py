"""One bounded way to take requests on a listening socket: every listener gpuweave opens to clients
it does not control goes through it (the node agent's control socket, the extender's probe port,
the node agent's metrics port).

A thread per connection lets any client that connects, then sends slowly, hold a thread for as
long as it likes: 2,000 such clients held 973 threads of a ``ThreadingHTTPServer``. Here no thread
ever waits on a client:

- one thread, the gate, accepts every connection and reads its request head without blocking
  (``selectors``): a slow client costs a socket and a buffer, never a thread;
- the head must arrive whole within ``deadline_s`` of the accept (for the whole head, not per
  read: a byte a second gets no longer) and be at most ``max_head_bytes``; else the listener's
  answer for that (``Refusal.LATE``, ``Refusal.TOO_LARGE``) is sent and the connection closed;
- at most ``max_connections`` connections are open at once, from accept to close. One more is
  answered ``Refusal.BUSY`` and closed at once; with ``displace`` it instead takes the place of
  the oldest connection still sending its head (that one gets ``BUSY``), so clients that send
  their request at once (the kubelet's probes) are served however many slow ones arrive;
- a whole head is answered by a pool of ``workers`` threads: ``serve(head)`` returns the answer.
  The worker writes what the socket takes at once (all of it, for a small answer); the rest goes
  back to the gate, which writes it as the client reads, for at most ``answer_s``, so a client
  that never reads its answer holds no worker either. One request per connection.

Answers to refused connections are written from the gate without waiting (they fit a fresh
socket's buffer; a client that takes nothing loses its answer, not our time).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

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
    answer_s: float = 30.0  # for the client to take the rest of an answer the socket did not take at once


HeadEnd = Callable[[bytearray, int], int]  # (data so far, where to look from) -> index past the head, or -1
Serve = Callable[[bytes], bytes]  # a whole head -> the answer
Refuse = Callable[[Refusal], bytes]  # why a connection is refused -> its answer


@dataclass
class _Held:
    """A connection the gate holds, until a deadline."""

    conn: socket.socket
    until: float


@dataclass
class _Reading(_Held):
    data: bytearray
    scanned: int = 0


@dataclass
class _Writing(_Held):
    left: memoryview


def _first(held: Mapping[int, _Held]) -> _Held | None:
    """The one with the earliest deadline (each map is kept in deadline order)."""
    return next(iter(held.values()), None)


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
        self._selector = selectors.DefaultSelector()
        self._reading: OrderedDict[int, _Reading] = OrderedDict()  # by fd, in deadline order
        self._writing: OrderedDict[int, _Writing] = OrderedDict()  # by fd, in deadline order
        self._replies: queue.SimpleQueue[tuple[socket.socket, memoryview]] = queue.SimpleQueue()
        self._wake_gate, self._waker = socket.socketpair()  # a worker wakes the gate for a reply
        self._open = 0  # reading + answering + writing
        self._open_lock = threading.Lock()
        self._stop = threading.Event()
        self._workers = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix=f"{name}-worker")
        self._thread = threading.Thread(target=self._run, name=f"{name}-gate", daemon=True)

    def start(self) -> None:
        self._listener.setblocking(False)
        self._wake_gate.setblocking(False)
        self._waker.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_gate, selectors.EVENT_READ, "wake")
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop accepting, close every connection the gate holds; ``wait``: for answers under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._selector.close()
        self._workers.shutdown(wait=wait)
        for conn in (self._wake_gate, self._waker):
            conn.close()
        while True:  # answers handed back after the gate ended: nobody will write them now
            try:
                conn, _ = self._replies.get_nowait()
            except queue.Empty:
                return
            _close(conn)
            self._release()

    def open_connections(self) -> int:
        with self._open_lock:
            return self._open

    # ---- the gate thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self._selector.select(self._wait_s()):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._take_replies()
                    elif events & selectors.EVENT_WRITE:
                        self._write(key.data)
                    else:
                        self._read(key.data)
                self._expire()
        finally:
            for reading in list(self._reading.values()):
                self._drop(reading.conn, answer=None)
            for writing in list(self._writing.values()):
                self._drop(writing.conn, answer=None)
            self._selector.close()

    def _wait_s(self) -> float:
        dues = [held.until for held in (_first(self._reading), _first(self._writing)) if held is not None]
        return max(0.0, min([TICK_S, *(until - self._clock() for until in dues)]))

    def _accept(self) -> None:
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
            if not self._take_place():
                _send_now(conn, self._refuse(Refusal.BUSY))
                _close(conn)
                continue
            self._reading[conn.fileno()] = _Reading(conn, self._clock() + self.limits.deadline_s, bytearray())
            self._selector.register(conn, selectors.EVENT_READ, conn.fileno())

    def _take_place(self) -> bool:
        """One more open connection, if the cap allows, or if it may displace the oldest head."""
        with self._open_lock:
            if self._open < self.limits.max_connections:
                self._open += 1
                return True
        if not (self.limits.displace and self._reading):
            return False
        oldest = next(iter(self._reading.values()))
        self._drop(oldest.conn, answer=Refusal.BUSY)  # its place passes to the newcomer
        with self._open_lock:
            self._open += 1
        return True

    def _read(self, fd: int) -> None:
        reading = self._reading[fd]
        try:
            chunk = reading.conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client is done sending: what it sent is its request, or nothing
            if reading.data:
                self._hand_over(reading, len(reading.data))
            else:
                self._drop(reading.conn, answer=None)
            return
        reading.data += chunk
        end = self._head_end(reading.data, reading.scanned)
        if 0 <= end <= self.limits.max_head_bytes:
            self._hand_over(reading, end)
        elif len(reading.data) > self.limits.max_head_bytes:
            self._drop(reading.conn, answer=Refusal.TOO_LARGE)
        else:
            reading.scanned = len(reading.data)

    def _take_replies(self) -> None:
        """Answers the workers could not write at once: the gate writes them as clients read."""
        with contextlib.suppress(OSError):
            while self._wake_gate.recv(4096):
                pass
        while True:
            try:
                conn, left = self._replies.get_nowait()
            except queue.Empty:
                return
            self._writing[conn.fileno()] = _Writing(conn, self._clock() + self.limits.answer_s, left)
            self._selector.register(conn, selectors.EVENT_WRITE, conn.fileno())

    def _write(self, fd: int) -> None:
        writing = self._writing[fd]
        try:
            writing.left = writing.left[writing.conn.send(writing.left) :]
        except BlockingIOError:
            return
        except OSError:
            self._drop(writing.conn, answer=None)
            return
        if not writing.left:
            self._drop(writing.conn, answer=None)

    def _expire(self) -> None:
        now = self._clock()
        for held, why in ((self._reading, Refusal.LATE), (self._writing, None)):
            while (first := _first(held)) is not None and first.until <= now:
                self._drop(first.conn, answer=why)

    def _forget(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        self._reading.pop(fd, None)
        self._writing.pop(fd, None)
        self._selector.unregister(conn)

    def _drop(self, conn: socket.socket, *, answer: Refusal | None) -> None:
        """Close a connection the gate holds, after ``answer``'s words if any; its place is free."""
        self._forget(conn)
        if answer is not None:
            _send_now(conn, self._refuse(answer))
        _close(conn)
        self._release()

    def _hand_over(self, reading: _Reading, end: int) -> None:
        self._forget(reading.conn)
        self._workers.submit(self._answer, reading.conn, bytes(reading.data[:end]))

    def _release(self) -> None:
        with self._open_lock:
            self._open -= 1

    # ---- a worker --------------------------------------------------------------------------------
    def _answer(self, conn: socket.socket, head: bytes) -> None:
        """Write what the socket takes now; the rest goes back to the gate (no wait on a client)."""
        try:
            answer = memoryview(self._serve(head))
        except Exception:  # a bug costs this connection, never the listener
            log.exception("%s: answering a request failed", self._name)
            answer = memoryview(b"")
        sent = _send_now(conn, answer)
        if sent < len(answer):
            self._replies.put((conn, answer[sent:]))
            with contextlib.suppress(OSError):  # full: the gate is awake already
                self._waker.send(b"\0")
            return
        _close(conn)
        self._release()


def _send_now(conn: socket.socket, answer: bytes | memoryview) -> int:
    """Write what the socket takes without waiting (a short answer: all of it); bytes written.
    A client gone counts as written: there is nobody to wait for."""
    try:
        return conn.send(answer) if answer else 0
    except BlockingIOError:
        return 0
    except OSError:
        return len(answer)


def _close(conn: socket.socket) -> None:
    """Close after the answer: end our side, drop what the client already sent (so the kernel
    closes with FIN, and the answer is not lost to a reset), close."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
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
