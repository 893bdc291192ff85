"""kubeio.client.Writer: a JSON POST through the kubernetes client's pool and credentials, with
the generated call's errors, and a rotated token picked up at the next credential refresh."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kubeio import client as kubeio_client
from kubeio.client import TokenAccess, Writer, api_client
from kubeio.errors import describe
from tests.support.loopback_api import answer_json, loopback_api


class Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []
    status: ClassVar[int] = 201

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.seen.append(
            {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": json.loads(body),
            }
        )
        answer_json(self, Recorder.status, {"kind": "Status"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def _fresh() -> None:
    Recorder.seen.clear()
    Recorder.status = 201


def test_posts_the_body_as_json_with_the_clients_headers() -> None:
    with loopback_api(Recorder) as api:
        answer = Writer(api).post("/api/v1/namespaces/a/events", {"kind": "Event", "n": [1, "ü"]})
    assert json.loads(answer) == {"kind": "Status"}
    (seen,) = Recorder.seen
    assert seen["path"] == "/api/v1/namespaces/a/events"
    assert seen["body"] == {"kind": "Event", "n": [1, "ü"]}
    assert seen["headers"]["content-type"] == "application/json"
    assert "OpenAPI-Generator" in seen["headers"]["user-agent"]


def test_an_error_answer_raises_the_generated_calls_exception_with_its_status() -> None:
    Recorder.status = 409
    with loopback_api(Recorder) as api, pytest.raises(ApiException) as raised:
        Writer(api).post("/api/v1/namespaces/a/pods/p/binding", {"kind": "Binding"})
    assert raised.value.status == 409
    assert describe(raised.value) == "HTTP 409 Conflict"


def test_a_rotated_token_is_sent_after_the_next_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    with loopback_api(Recorder) as loopback:
        server = str(loopback.configuration.host)
        api = api_client(token=TokenAccess(server=server, token_file=token))
        writer = Writer(api)
        writer.post("/x", {})
        token.write_text("second\n")
        writer.post("/x", {})  # within AUTH_REFRESH_S: the credentials read at first still serve
        monkeypatch.setattr(kubeio_client, "AUTH_REFRESH_S", 0.0)
        writer.post("/x", {})
        api.close()  # type: ignore[no-untyped-call]
    tokens = [seen["headers"]["authorization"] for seen in Recorder.seen]
    assert tokens == ["Bearer first", "Bearer first", "Bearer second"]


def test_an_api_server_behind_a_path_gets_the_path_and_a_closed_pool_is_opened_again() -> None:
    with loopback_api(Recorder) as api:
        api.configuration.host = str(api.configuration.host) + "/k8s/clusters/c-1/"
        writer = Writer(api)
        writer.post("/api/v1/namespaces/a/events", {"n": 1})
        api.rest_client.pool_manager.clear()  # the manager closes its pools (as an eviction does)
        writer.post("/api/v1/namespaces/a/events", {"n": 2})
    assert [(s["path"], s["body"]["n"]) for s in Recorder.seen] == [
        ("/k8s/clusters/c-1/api/v1/namespaces/a/events", 1),
        ("/k8s/clusters/c-1/api/v1/namespaces/a/events", 2),
    ]


class KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; the answer's framing is chosen per request path."""

    protocol_version = "HTTP/1.1"
    peers: ClassVar[list[tuple[str, int]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        KeepAlive.peers.append(self.client_address)
        answer = b'{"kind":"Status","path":"' + self.path.encode() + b'"}'
        status = 409 if "conflict" in self.path else 201
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if "chunked" in self.path:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(answer) // 2
            for part in (answer[:half], answer[half:]):
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nX-Trailer: t\r\n\r\n")
        elif "unframed" in self.path:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(answer)
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_posts_in_a_row_share_one_kept_alive_connection_whatever_the_answers_framing() -> None:
    KeepAlive.peers.clear()
    with loopback_api(KeepAlive) as api:
        writer = Writer(api)
        answers = [
            json.loads(writer.post(f"/{kind}", {"i": i})) for i, kind in enumerate(["a", "chunked"] * 3)
        ]
        with pytest.raises(ApiException) as raised:
            writer.post("/conflict", {})
        writer.post("/after", {})
    assert [a["path"] for a in answers] == ["/a", "/chunked"] * 3
    assert raised.value.status == 409 and '"path":"/conflict"' in raised.value.body
    assert len(set(KeepAlive.peers)) == 1, KeepAlive.peers


def test_an_answer_framed_by_the_connections_end_is_read_whole_and_the_next_post_reconnects() -> None:
    KeepAlive.peers.clear()
    with loopback_api(KeepAlive) as api:
        writer = Writer(api)
        first = json.loads(writer.post("/unframed", {}))
        second = json.loads(writer.post("/a", {}))
    assert (first["path"], second["path"]) == ("/unframed", "/a")
    assert len(set(KeepAlive.peers)) == 2


def test_a_connection_the_server_dropped_is_replaced() -> None:
    KeepAlive.peers.clear()
    with loopback_api(KeepAlive) as api:
        writer = Writer(api)
        writer.post("/a", {})
        pool = api.rest_client.pool_manager.connection_from_url(api.configuration.host)
        conn = pool.pool.get()  # the kept-alive connection, shut as an idle timeout would
        conn.sock.shutdown(2)
        pool.pool.put(conn)
        writer.post("/b", {})
    assert len(KeepAlive.peers) == 2


def test_a_path_or_header_that_could_split_the_request_is_refused() -> None:
    with loopback_api(KeepAlive) as api:
        writer = Writer(api)
        with pytest.raises(ValueError):
            writer.post("/a b", {})
        api.default_headers["X-Bad"] = "v\r\nX-Injected: 1"
        with pytest.raises(ValueError):
            Writer(api).post("/a", {})


def _recv(*parts: bytes) -> Any:
    """A socket's ``recv`` handing out ``parts`` one per call, then the connection's end."""
    pending = list(parts)
    return lambda _size: pending.pop(0) if pending else b""


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (  # an interim answer, then the real one split mid-field
            (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Crea", b"ted\r\nContent-Length: 2\r\n\r\n{}"),
            (201, "Created", b"{}", True),
        ),
        ((b"HTTP/1.1 204 No Content\r\n\r\n",), (204, "No Content", b"", True)),
        ((b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 1\r\n\r\nx"), (200, "OK", b"x", True)),
        ((b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",), (200, "OK", b"x", False)),
        ((b"HTTP/1.0 200 OK\r\n\r\nto the ", b"end"), (200, "OK", b"to the end", False)),
    ],
)
def test_answers_are_read_by_their_framing(parts: tuple[bytes, ...], expected: tuple[Any, ...]) -> None:
    assert kubeio_client.read_answer(_recv(*parts)) == expected


@pytest.mark.parametrize(
    ("parts", "problem"),
    [
        ((b"SSH-2.0-OpenSSH_9.6\r\n",), "not HTTP"),
        ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",), "mid-answer"),
        ((b"HTTP/1.1 200 OK\r\n", b"X-Long: " + b"a" * 70_000), "header fields"),
    ],
)
def test_an_answer_cut_short_not_http_or_with_too_long_a_head_is_a_protocol_error(
    parts: tuple[bytes, ...], problem: str
) -> None:
    with pytest.raises(urllib3.exceptions.ProtocolError, match=problem):
        kubeio_client.read_answer(_recv(*parts))
