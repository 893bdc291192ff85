"""Protocol edges over real HTTP: bad bodies, both nodeCacheCapable modes, preempt, TLS, metrics."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devicemodel.contracts import ANNOTATION_PLACEMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import node_object, pod_object
from scheduler_ext.app import Extender, build_snapshot_extender
from tests.transport.test_extender_http import NODES, Client, _args, _snapshot, client, extender

__all__ = ["client", "extender"]  # fixtures shared with the basic suite

GPU8 = {RESOURCE_GPU: 8}


def _raw(address: str, payload: bytes, headers: dict[str, str]) -> tuple[int, str]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest("POST", "/filter", skip_accept_encoding=True)
        for key, value in headers.items():
            connection.putheader(key, value)
        connection.endheaders()
        connection.send(payload)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"Pod": "x", "NodeNames": []}', "Pod"),
        (b'{"Pod": {"metadata": {"name": 5}}, "NodeNames": ["a"]}', "metadata.name"),
        (b'{"Pod": {}, "NodeNames": "h100-a"}', "NodeNames"),
        (b'{"NodeNames": []}', "Pod"),
        (b'{"Pod": {"metadata": {"annotations": {"a": 1}}}, "NodeNames": []}', "annotations"),
        (b"\xff\xfe", "not JSON"),
        (b"[" * 100_000, "not JSON"),
    ],
)
def test_malformed_bodies_get_400_and_the_connection_keeps_serving(
    client: Client, body: bytes, reason: str
) -> None:
    status, text = client.post("filter", body)
    assert status == 400 and reason in text
    status, result = client.post("filter", _args(pod_object("ok", limits=GPU8)))
    assert status == 200 and result["NodeNames"]


def test_oversized_body_is_refused_and_server_keeps_serving(
    extender: tuple[Extender, str], client: Client
) -> None:
    big = json.dumps({"Pod": {}, "NodeNames": ["n" * 1000] * 9000}).encode()
    status, text = client.post("filter", big)
    assert status == 400 and "limit" in text
    assert client.post("filter", _args(pod_object("ok", limits=GPU8)))[0] == 200


def test_lying_content_length_and_chunked_bodies_get_400(extender: tuple[Extender, str]) -> None:
    _, address = extender
    assert _raw(address, b"{}", {"Content-Length": "abc"})[0] == 400
    assert _raw(address, b"{}", {"Transfer-Encoding": "chunked"})[0] == 400
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:  # body ends early
        raw.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}")
        raw.shutdown(socket.SHUT_WR)
        assert raw.recv(100).startswith(b"HTTP/1.1 400")


def test_bad_pod_quantity_fails_every_node_in_band(client: Client) -> None:
    status, result = client.post("filter", _args(pod_object("bad", limits={RESOURCE_GPU: "half"})))
    assert status == 200 and result["NodeNames"] == []
    assert set(result["FailedAndUnresolvableNodes"]) == set(NODES)
    assert "whole number" in result["FailedAndUnresolvableNodes"]["h100-a"]


def test_lowercase_keys_decode_as_go_does(client: Client) -> None:
    status, result = client.post("filter", {"pod": pod_object("lc", limits=GPU8), "nodenames": ["h100-a"]})
    assert status == 200 and result["NodeNames"] == ["h100-a"]


def test_full_node_list_mode_returns_nodes(client: Client) -> None:
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [node_object(n, gpus=8) for n in NODES]}
    pod = pod_object("list-mode", limits=GPU8)
    status, result = client.post("filter", {"Pod": pod, "Nodes": nodes, "NodeNames": None})
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["h100-a", "h100-b", "v100-a"]
    assert result["Nodes"]["items"][0]["status"]["allocatable"][RESOURCE_GPU] == "8"
    status, scores = client.post("prioritize", {"Pod": pod, "Nodes": nodes, "NodeNames": None})
    assert status == 200 and [s["Host"] for s in scores] == NODES


def _bind(client: Client, name: str, node: str) -> str:
    status, result = client.post(
        "bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-default-{name}", "Node": node}
    )
    assert status == 200
    return str(result["Error"])


def test_preempt_names_device_holding_victims_for_empty_candidate_lists(client: Client) -> None:
    for name, node in (("low-a", "h100-a"), ("low-b", "h100-b")):
        client.post("filter", _args(pod_object(name, limits=GPU8, priority=1)))
        assert _bind(client, name, node) == ""
    urgent = pod_object("urgent", limits={RESOURCE_GPU: 4}, priority=100)
    status, result = client.post("filter", _args(urgent, ["h100-a", "h100-b"]))
    assert result["NodeNames"] == [] and "h100-a" in result["FailedNodes"]
    args = {
        "Pod": urgent,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "h100-a": {"Pods": [], "NumPDBViolations": 0},
            "h100-b": {"Pods": None, "NumPDBViolations": 0},
            "v100-a": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    status, result = client.post("preempt", args)
    assert status == 200
    victims = result["NodeNameToMetaVictims"]
    assert victims["h100-a"]["Pods"] == [{"UID": "uid-default-low-a"}]
    assert victims["h100-b"]["Pods"] == [{"UID": "uid-default-low-b"}]
    assert victims["v100-a"]["Pods"] == []  # fits as it is: a candidate with no victims


def test_preempt_keeps_scheduler_victims_and_never_evicts_higher_priority(client: Client) -> None:
    client.post("filter", _args(pod_object("vip", limits=GPU8, priority=1000)))
    assert _bind(client, "vip", "h100-a") == ""
    pod = pod_object("mid", limits={RESOURCE_GPU: 2}, priority=10)
    victims = {"Pods": [pod_object("cpu-hog", priority=0)], "NumPDBViolations": 1}
    status, result = client.post("preempt", {"Pod": pod, "NodeNameToVictims": {"h100-a": victims}})
    assert status == 200 and result == {"NodeNameToMetaVictims": {}}
    status, result = client.post("preempt", {"Pod": pod, "NodeNameToVictims": {"h100-b": victims}})
    assert result["NodeNameToMetaVictims"]["h100-b"] == {
        "Pods": [{"UID": "uid-default-cpu-hog"}],
        "NumPDBViolations": 1,
    }


def test_bound_gpus_leave_an_nvlink_group_and_reasons_count_free_gpus(client: Client) -> None:
    client.post("filter", _args(pod_object("half", limits={RESOURCE_GPU: 5})))
    assert _bind(client, "half", "v100-a") == ""
    pod = pod_object("mesh", limits={RESOURCE_GPU: 3}, annotations={ANNOTATION_PLACEMENT: "nvlink-required"})
    _, result = client.post("filter", _args(pod, ["v100-a"]))
    assert result["NodeNames"] == ["v100-a"]  # the 5-GPU bind left an NVLink triangle free
    pod = pod_object("mesh4", limits={RESOURCE_GPU: 4}, annotations={ANNOTATION_PLACEMENT: "nvlink-required"})
    _, result = client.post("filter", _args(pod, ["v100-a"]))
    assert "needs 4 free GPUs; node has 3 free" in result["FailedNodes"]["v100-a"]


def test_health_ready_and_metrics(client: Client) -> None:
    client.post("filter", _args(pod_object("m", limits={RESOURCE_GPU: 9})))
    client.post("filter", b"nope")
    assert client.get("/healthz")[0] == 200
    assert client.get("/readyz") == (200, "ok\n")
    status, text = client.get("/metrics")
    assert status == 200
    assert 'gpuweave_extender_request_seconds_count{verb="filter"}' in text
    assert 'gpuweave_extender_rejections_total{reason="capacity"}' in text
    assert 'gpuweave_extender_bad_requests_total{verb="filter"} 1.0' in text


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_https_serves_the_same_protocol(tmp_path: Path, tls_files: tuple[Path, Path]) -> None:
    built = build_snapshot_extender(_snapshot(tmp_path))
    url = built.serve(host="127.0.0.1", port=0, tls_cert=tls_files[0], tls_key=tls_files[1])
    try:
        assert url.startswith("https://")
        context = ssl.create_default_context(cafile=str(tls_files[0]))
        context.check_hostname = False
        host, port = url.removeprefix("https://").rsplit(":", 1)
        connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
        body = json.dumps(_args(pod_object("tls", limits=GPU8))).encode()
        connection.request("POST", "/filter", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        result: dict[str, Any] = json.loads(response.read())
        connection.close()
        assert response.status == 200 and result["NodeNames"] == ["h100-a", "h100-b", "v100-a"]
        with socket.create_connection((host, int(port)), timeout=10) as plain:  # plain HTTP is refused
            plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                answer = plain.recv(100)
            except ConnectionResetError:
                answer = b""
            assert not answer.startswith(b"HTTP/1.1 200")
        assert built.service.cache.synced.is_set()  # the failed handshake did not take the server down
        connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        built.close()


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
KEYS = (
    "Pod",
    "Nodes",
    "NodeNames",
    "PodName",
    "PodNamespace",
    "PodUID",
    "Node",
    "NodeNameToVictims",
    "NodeNameToMetaVictims",
    "metadata",
    "spec",
    "containers",
    "resources",
    "limits",
    "annotations",
)


def _mutate(value: Any, path: list[str], replacement: Any) -> Any:
    """``value`` with the object member at ``path`` (keys that exist, in order) replaced."""
    if not path or not isinstance(value, dict) or path[0] not in value:
        return replacement
    return {**value, path[0]: _mutate(value[path[0]], path[1:], replacement)}


def test_fuzzed_bodies_never_get_a_5xx_and_the_server_keeps_serving(tmp_path: Path) -> None:
    built = build_snapshot_extender(_snapshot(tmp_path))
    built.serve(host="127.0.0.1", port=0)
    assert built.server is not None
    host, port = built.server.server_address[:2]
    client = Client(f"{host!s}:{port}")
    valid = _args(pod_object("fuzz", limits=GPU8))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]),
        body=JSON_VALUES,
        path=st.lists(st.sampled_from(KEYS), max_size=5),
        mutate=st.booleans(),
    )
    def check(verb: str, body: Any, path: list[str], mutate: bool) -> None:
        payload = _mutate(valid, path, body) if mutate else body
        status, _ = client.post(verb, json.dumps(payload).encode())
        assert status in (200, 400)

    try:
        check()
        status, result = client.post("filter", valid)
        assert status == 200 and result["NodeNames"]
    finally:
        client.close()
        built.close()


def test_node_list_mode_answers_with_nodes_even_for_bad_pods(client: Client) -> None:
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [node_object(n, gpus=8) for n in NODES]}
    pod = pod_object("bad-list", limits={RESOURCE_GPU: "lots"})
    status, result = client.post("filter", {"Pod": pod, "Nodes": nodes, "NodeNames": None})
    assert status == 200
    assert result["Nodes"]["items"] == [] and result["NodeNames"] is None
    assert set(result["FailedAndUnresolvableNodes"]) == set(NODES)


def test_bind_for_a_recreated_pod_is_refused(client: Client) -> None:
    client.post("filter", _args(pod_object("again", limits={RESOURCE_GPU: 1})))
    status, result = client.post(
        "bind",
        {"PodName": "again", "PodNamespace": "default", "PodUID": "uid-of-a-newer-pod", "Node": "h100-a"},
    )
    assert status == 200 and "unknown to the extender" in result["Error"]


def _exchange(address: str, request: bytes) -> bytes:
    """Send raw bytes, read until the server closes the connection (or 2 s pass)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as raw:
        raw.sendall(request)
        received = b""
        try:
            while chunk := raw.recv(65536):
                received += chunk
        except TimeoutError:
            pass
        return received


def test_request_heads_the_server_refuses_and_the_connection_rules(extender: tuple[Extender, str]) -> None:
    _, address = extender
    body = json.dumps(_args(pod_object("ok", limits=GPU8))).encode()

    def post(version: bytes = b"HTTP/1.1", fields: bytes = b"") -> bytes:
        return (
            b"POST /filter %s\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (version, len(body), fields)
            + body
        )

    last = post(fields=b"Connection: close\r\n")  # the server closes after it: no wait for a timeout
    # HTTP/1.0 without keep-alive: answered, then closed (no answer for the pipelined second request)
    answer = _exchange(address, post(b"HTTP/1.0") * 2)
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 ") == 1
    assert b"Connection: close" in answer
    # HTTP/1.1: one connection answers every pipelined request
    assert _exchange(address, post() * 2 + last).count(b"HTTP/1.1 200") == 3
    # lower-case field names are the same fields
    lower = b"POST /filter HTTP/1.1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    assert _exchange(address, lower).startswith(b"HTTP/1.1 200")
    # Expect: 100-continue gets the interim answer, then the real one
    answer = _exchange(address, post(fields=b"Expect: 100-continue\r\nConnection: close\r\n"))
    assert answer.startswith(b"HTTP/1.1 100") and b"HTTP/1.1 200" in answer
    for request, status in [
        (b"POST /filter HTTP/2.0\r\nHost: x\r\n\r\n", b"505"),
        (b"POST /filter\r\n\r\n", b"400"),
        (b"POST /filter HTTP/1.1\r\nHost: x\r\n folded: y\r\n\r\n", b"400"),
        (b"POST /filter HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}", b"400"),
        (b"POST /filter HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", b"431"),
    ]:
        answer = _exchange(address, request + last)
        assert answer.startswith(b"HTTP/1.1 " + status), answer[:80]
        assert answer.count(b"HTTP/1.1 ") == 1  # a refused head closes the connection
    assert _exchange(address, last).startswith(b"HTTP/1.1 200")  # and the server keeps serving
