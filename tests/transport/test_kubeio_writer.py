"""kubeio.client.Writer: a JSON POST through the kubernetes client's pool and credentials, with
the generated call's errors, and a rotated token picked up at the next credential refresh."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes.client.exceptions import ApiException

from kubeio import client as kubeio_client
from kubeio.client import TokenAccess, Writer, api_client
from kubeio.errors import describe
from tests.support.loopback_api import loopback_api


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
        answer = b'{"kind":"Status"}'
        self.send_response(Recorder.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

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
