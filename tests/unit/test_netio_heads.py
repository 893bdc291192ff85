"""Where a request head ends (``netio.gate``), found from where the last look stopped, and what the
probe listener answers to each head (``netio.probe_http``), without a socket."""

from __future__ import annotations

import pytest

from netio.gate import http_head_end, line_end
from netio.probe_http import TEXT, ProbeListener

HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize(
    ("data", "end"),
    [
        (HEAD, len(HEAD)),
        (HEAD + b"body", len(HEAD)),
        (b"GET / HTTP/1.1\nHost: x\n\n", 24),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", -1),
        (b"", -1),
    ],
)
def test_http_head_end(data: bytes, end: int) -> None:
    assert http_head_end(bytearray(data), 0) == end


def test_a_head_arriving_byte_by_byte_is_found_from_the_last_look() -> None:
    data, scanned = bytearray(), 0
    for index, byte in enumerate(HEAD):
        data.append(byte)
        found = http_head_end(data, scanned)
        assert found == (len(HEAD) if index == len(HEAD) - 1 else -1)
        scanned = len(data)
    assert line_end(bytearray(b'{"method": "x"}\n{'), 0) == 16 and line_end(bytearray(b"{"), 0) == -1


@pytest.fixture
def listener() -> ProbeListener:
    made = ProbeListener(("127.0.0.1", 0), {"/healthz": lambda: (200, b"ok\n", TEXT)}, name="test-probes")
    made.stop()  # bound, never started: only its answers are used
    return made


@pytest.mark.parametrize(
    ("head", "status", "body"),
    [
        (HEAD, 200, b"ok\n"),
        (b"GET /healthz/?x=1 HTTP/1.0\r\n\r\n", 200, b"ok\n"),
        (b"HEAD /healthz HTTP/1.1\r\n\r\n", 200, b""),
        (b"GET /other HTTP/1.1\r\n\r\n", 404, b"not found\n"),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 2\r\n\r\n", 405, b"this port serves GET only\n"),
        (b"GET /healthz\r\n\r\n", 400, b"bad request line\n"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", 505, b"HTTP/1.x only\n"),
    ],
)
def test_probe_answers(listener: ProbeListener, head: bytes, status: int, body: bytes) -> None:
    answer = listener.answer(head)
    first, _, rest = answer.partition(b"\r\n")
    fields, _, sent = rest.partition(b"\r\n\r\n")
    assert first.startswith(f"HTTP/1.1 {status} ".encode()) and sent == body
    assert b"Connection: close" in fields
