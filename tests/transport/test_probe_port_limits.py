"""The probe and metrics ports (the extender's ``--probe-listen``, the node agent's
``--metrics-address``) under slow clients, over real TCP on 127.0.0.1: 200 clients that never
finish their request head hold no thread, a client that trickles its head is cut at the deadline
with a 408, connections past the cap displace the oldest unfinished head, and a normal ``GET``
still gets its answer throughout (``netio.gate``)."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuweave.simulate.cluster_objects import cluster_list
from netio.gate import GateLimits
from netio.probe_http import PROBE_LIMITS, TEXT, ProbeListener
from nodeagent.metrics import metrics_listener
from scheduler_ext.app import build_snapshot_extender
from tests.support.waiting import wait_until

SLOW_CLIENTS = 200
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: probe\r\n"  # no empty line: the head never ends


def _get(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    """One GET on a fresh connection, as the kubelet probes: the status and the body."""
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: probe\r\nUser-Agent: kube-probe/1.37\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class Probes:
    """A started listener of one kind, with the path a probe asks for and its expected answer."""

    def __init__(self, listener: ProbeListener, path: str, expect: bytes) -> None:
        self.listener, self.path, self.expect = listener, path, expect
        self.address = listener.server_address


@pytest.fixture(params=["extender-probes", "agent-metrics"])
def make_probes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Probes]]:
    """A factory: the listener of the parametrized kind, started with the limits given."""
    with ExitStack() as stack:

        def make(limits: GateLimits = PROBE_LIMITS) -> Probes:
            if request.param == "extender-probes":
                snapshot = tmp_path / "cluster.json"
                snapshot.write_text(json.dumps(cluster_list([])))
                extender = build_snapshot_extender(snapshot)
                stack.callback(extender.close)
                extender.serve_probes(host="127.0.0.1", port=0, limits=limits)
                assert extender.probe_server is not None
                return Probes(extender.probe_server, "/healthz", b"ok\n")
            registry = CollectorRegistry()
            Counter("gpuweave_test_probes", "a sample", registry=registry).inc()
            listener = metrics_listener(registry, host="127.0.0.1", port=0, limits=limits)
            listener.start()
            stack.callback(listener.stop)
            return Probes(listener, "/metrics", b"gpuweave_test_probes_total 1.0")

        yield make


def _slow_clients(stack: ExitStack, address: tuple[str, int], count: int) -> list[socket.socket]:
    clients = []
    for _ in range(count):
        conn = stack.enter_context(socket.create_connection(address, timeout=10))
        conn.sendall(PARTIAL_HEAD)
        clients.append(conn)
    return clients


def test_slow_clients_hold_no_thread_and_a_probe_still_answers(make_probes: Callable[..., Probes]) -> None:
    probes: Probes = make_probes()
    status, body = _get(probes.address, probes.path)  # the first answer starts a worker
    assert status == 200 and probes.expect in body
    before = set(threading.enumerate())
    with ExitStack() as stack:
        _slow_clients(stack, probes.address, SLOW_CLIENTS)
        accepted = lambda: probes.listener.open_connections() == SLOW_CLIENTS  # noqa: E731
        wait_until("the slow clients are accepted", accepted)
        status, body = _get(probes.address, probes.path)  # the kubelet's probe meanwhile
        assert status == 200 and probes.expect in body
        assert _get(probes.address, "/nope")[0] == 404
        started = [t.name for t in threading.enumerate() if t not in before]
        assert len(started) <= PROBE_LIMITS.workers, started  # no thread per client


def test_a_client_trickling_its_head_is_cut_at_the_deadline(make_probes: Callable[..., Probes]) -> None:
    """One byte every 50 ms, for up to 10 s: the 0.5 s deadline is for the whole head, not per read."""
    probes: Probes = make_probes(replace(PROBE_LIMITS, deadline_s=0.5))
    header = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200
    with socket.create_connection(probes.address, timeout=10) as conn:
        answer = b""
        for byte in header:
            try:
                conn.sendall(bytes([byte]))
            except OSError:  # closed under us: the answer is already in our buffer
                break
            if select.select([conn], [], [], 0.05)[0]:
                break
        else:
            pytest.fail("the server took a 10 s trickle of a request head without cutting it")
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ") and b"within 0.5 s" in answer
    status, body = _get(probes.address, probes.path)
    assert status == 200 and probes.expect in body


def test_past_the_cap_a_new_connection_displaces_the_oldest_unfinished_head(
    make_probes: Callable[..., Probes],
) -> None:
    probes: Probes = make_probes(replace(PROBE_LIMITS, max_connections=8))
    with ExitStack() as stack:
        slow = _slow_clients(stack, probes.address, 8)
        wait_until("the slow clients are accepted", lambda: probes.listener.open_connections() == 8)
        status, body = _get(probes.address, probes.path)
        assert status == 200 and probes.expect in body
        oldest = slow[0].makefile("rb").read()  # answered busy, then closed
        assert oldest.startswith(b"HTTP/1.1 503 ")
        assert probes.listener.open_connections() <= 8
    wait_until("every closed client is let go", lambda: probes.listener.open_connections() == 0)


def test_clients_that_never_read_their_answer_hold_no_worker() -> None:
    """Ten clients ask for 8 MiB and read none of it: the gate holds their answers (sockets, not
    workers), and a probe is still answered by the two workers."""
    big = b"x" * (8 << 20)
    routes = {"/big": lambda: (200, big, TEXT), "/healthz": lambda: (200, b"ok\n", TEXT)}
    listener = ProbeListener(("127.0.0.1", 0), routes, name="test-probes")
    listener.start()
    try:
        with ExitStack() as stack:
            for _ in range(10):
                conn = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that stays shut
                conn.connect(listener.server_address)
                conn.sendall(b"GET /big HTTP/1.1\r\nHost: probe\r\n\r\n")
            before = set(threading.enumerate())
            wait_until("ten answers are being written", lambda: listener.open_connections() == 10)
            assert _get(listener.server_address, "/healthz") == (200, b"ok\n")
            held = lambda: listener.open_connections() == 10  # noqa: E731
            wait_until("the probe's connection let go, the ten unread answers still held", held)
            started = [t.name for t in threading.enumerate() if t not in before]
            assert len(started) <= PROBE_LIMITS.workers, started
    finally:
        listener.stop()
