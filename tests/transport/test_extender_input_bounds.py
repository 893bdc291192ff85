"""What a hostile pod or client can make the extender do, over real HTTP on 127.0.0.1: echoed
input is cut (a 200 KiB annotation is not repeated into every node's reason), a pod nested 1,000
deep gets a 400 on every verb, and request framing is strict (Content-Length is digits only, no
Transfer-Encoding), each refusal answered with a status line while the server keeps serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import ANNOTATION_GPU_SELECTOR, ANNOTATION_PLACEMENT, RESOURCE_GPU
from devicemodel.errors import ECHO_CHARS, MAX_REASON_CHARS, echo
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, build_snapshot_extender

NAMES = [f"node-{i:03d}" for i in range(500)]
DEEP = '{"a":' * 1000 + "1" + "}" * 1000


@pytest.fixture
def address(tmp_path: Path) -> Iterator[tuple[str, int]]:
    snapshot = tmp_path / "empty.json"
    snapshot.write_text(json.dumps(cluster_list([])))
    built: Extender = build_snapshot_extender(snapshot)
    try:
        built.serve(host="127.0.0.1", port=0)
        assert built.server is not None
        yield "127.0.0.1", built.server.server_address[1]
    finally:
        built.close()


def _exchange(address: tuple[str, int], raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` as is on a new connection; the first answer's status and body."""
    with socket.create_connection(address, timeout=30) as connection:
        connection.sendall(raw)
        reader = connection.makefile("rb")
        status = int(reader.readline().split()[1])
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, reader.read(length)


def _post(address: tuple[str, int], verb: str, body: bytes, *, head: str = "") -> tuple[int, bytes]:
    head = head or f"Content-Length: {len(body)}\r\n"
    return _exchange(address, f"POST /{verb} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body)


def _filter_body(pod: dict[str, Any]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": NAMES}).encode()


def test_a_200_kib_placement_over_500_nodes_gets_an_answer_under_1_mib(address: tuple[str, int]) -> None:
    value = "nvlink-" * (200 * 1024 // 7)
    pod = pod_object("big", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_PLACEMENT: value})
    status, body = _post(address, "filter", _filter_body(pod))
    assert status == 200 and len(body) < 1 << 20
    answer = json.loads(body)
    reasons = set(answer["FailedAndUnresolvableNodes"].values())
    assert len(answer["FailedAndUnresolvableNodes"]) == len(NAMES) and len(reasons) == 1
    (reason,) = reasons
    assert ANNOTATION_PLACEMENT in reason and f"({len(value)} characters)" in reason


def test_an_uncompilable_9_kib_selector_costs_a_bounded_reason_per_node(tmp_path: Path) -> None:
    """The selector compiles per node kind; its error quotes the expression: cut per node."""
    items: list[dict[str, Any]] = []
    names = [f"gpu-{i:03d}" for i in range(100)]
    for name in names:
        items += [node_object(name, gpus=8), inventory_object(profile_inventory("dgx-h100", name))]
    snapshot = tmp_path / "nodes.json"
    snapshot.write_text(json.dumps(cluster_list(items)))
    built = build_snapshot_extender(snapshot)
    try:
        built.serve(host="127.0.0.1", port=0)
        assert built.server is not None
        selector = 'device.attributes["gpuweave.io"].productName == "' + "x" * 9 * 1024 + '" &&'
        pod = pod_object(
            "selector", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_GPU_SELECTOR: selector}
        )
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        status, answer = _post(("127.0.0.1", built.server.server_address[1]), "filter", body)
    finally:
        built.close()
    assert status == 200
    rejected = json.loads(answer)["FailedAndUnresolvableNodes"]
    reason = next(iter(rejected.values()))
    assert len(rejected) == len(names) and "does not compile" in reason
    # the parser's own words survive; the expression is quoted once, cut, with its length
    assert "Syntax error" in reason and f"({len(selector)} characters)" in reason
    assert reason.count("productName") == 1 and len(reason) <= MAX_REASON_CHARS
    assert len(answer) < len(names) * (MAX_REASON_CHARS + 100)  # the name, the reason, the separators


def test_echo_cuts_a_value_to_its_first_characters_and_says_how_long_it_was() -> None:
    shown = echo("g" * 100_000)
    assert len(shown) < ECHO_CHARS + 40 and shown.endswith("(100000 characters)")
    assert echo("short") == "'short'"


@pytest.mark.parametrize("verb", ["filter", "prioritize", "prioritize-claims", "preempt"])
def test_a_pod_nested_1000_deep_gets_a_400_on_every_verb(address: tuple[str, int], verb: str) -> None:
    pod = pod_object("deep", limits={RESOURCE_GPU: 1})
    pod["spec"]["affinity"] = "@DEEP@"
    message: dict[str, Any] = {"Pod": pod, "NodeNames": NAMES[:2]}
    if verb == "preempt":
        message = {"Pod": pod, "NodeNameToVictims": {}, "NodeNameToMetaVictims": {}}
    body = json.dumps(message).replace('"@DEEP@"', DEEP).encode()
    for _ in range(2):  # the second call meets whatever the first one kept
        status, text = _post(address, verb, body)
        assert status == 400 and b"deeper than" in text
    assert _post(address, "filter", _filter_body(pod_object("plain")))[0] == 200


def test_a_victim_nested_1000_deep_gets_a_400_from_preempt(address: tuple[str, int]) -> None:
    victims = {"node-000": {"Pods": ["@DEEP@"], "NumPDBViolations": 0}}
    message = {"Pod": pod_object("p"), "NodeNameToVictims": victims, "NodeNameToMetaVictims": {}}
    status, text = _post(address, "preempt", json.dumps(message).replace('"@DEEP@"', DEEP).encode())
    assert status == 400 and b"deeper than" in text


def test_meta_victims_are_not_walked_for_depth_but_validated_when_read(address: tuple[str, int]) -> None:
    """The meta form keeps nothing as sent: a deep key pydantic ignores costs no walk and no 400,
    a deep value where a UID belongs is refused naming the node and field, and the server serves on."""
    pod = pod_object("p")  # asks for nothing of ours: kube-scheduler's victims are kept as proposed
    ignored = {"node-000": {"Pods": [{"UID": "v1", "extra": "@DEEP@"}], "NumPDBViolations": 0}}
    body = json.dumps({"Pod": pod, "NodeNameToMetaVictims": ignored}).replace('"@DEEP@"', DEEP)
    status, text = _post(address, "preempt", body.encode())
    assert status == 200, text
    assert json.loads(text)["NodeNameToMetaVictims"] == {
        "node-000": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}
    }
    bad = {"node-000": {"Pods": [{"UID": "@DEEP@"}], "NumPDBViolations": 0}}
    body = json.dumps({"Pod": pod, "NodeNameToMetaVictims": bad}).replace('"@DEEP@"', DEEP)
    status, text = _post(address, "preempt", body.encode())
    assert status == 400 and b"NodeNameToMetaVictims.node-000.Pods.0.UID" in text, text
    assert _post(address, "filter", _filter_body(pod_object("plain")))[0] == 200


@pytest.mark.parametrize(
    "head",
    [
        "Content-Length: 1_1\r\n",
        "Content-Length: +11\r\n",
        "Content-Length: -11\r\n",
        "Content-Length: 0x0b\r\n",
        "Content-Length: \r\n",
        "Content-Length: \u0661\u0661\r\n",  # Arabic-Indic digits: int() takes them
        "Transfer-Encoding: chunked\r\nContent-Length: 11\r\n",
        "Transfer-Encoding: gzip\r\nContent-Length: 11\r\n",
        "Transfer-Encoding: identity\r\n",
        "Content-Length: " + "9" * 5000 + "\r\n",  # past int()'s 4,300 digits
    ],
)
def test_lax_framing_is_refused_with_a_status_line(address: tuple[str, int], head: str) -> None:
    status, text = _exchange(
        address, f"POST /filter HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + b'{"Pod": {}}'
    )
    assert status == 400 and text
    assert _post(address, "filter", _filter_body(pod_object("plain")))[0] == 200  # still serving


def _answers(address: tuple[str, int], raw: bytes) -> list[tuple[int, bytes]]:
    """Every answer on one connection to ``raw`` (its last request says Connection: close)."""
    answers: list[tuple[int, bytes]] = []
    with socket.create_connection(address, timeout=30) as connection:
        connection.sendall(raw)
        reader = connection.makefile("rb")
        while line := reader.readline():
            length = 0
            while (field := reader.readline()) not in (b"\r\n", b""):
                name, _, value = field.decode("latin-1").partition(":")
                length = int(value) if name.lower() == "content-length" else length
            answers.append((int(line.split()[1]), reader.read(length)))
    return answers


CLOSE = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "request_head",
    [
        b"POST /no-such-verb HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n",
        b"POST /no-such-verb HTTP/1.1\r\nHost: x\r\nContent-Length: 1_1\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n",
    ],
)
def test_framing_is_checked_on_every_route(address: tuple[str, int], request_head: bytes) -> None:
    """An unknown verb or a GET is framed by the same rules: a refused head closes the connection,
    so the bytes after it are never read as a request."""
    answers = _answers(address, request_head + b"\r\n{}" + CLOSE)
    assert [status for status, _ in answers] == [400]
    assert _answers(address, CLOSE) == [(200, b"ok\n")]  # still serving


def test_a_body_sent_with_a_get_is_read_as_its_body(address: tuple[str, int]) -> None:
    """A GET with a Content-Length: its body is drained, not read as the next request."""
    smuggled = b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n"
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
    assert _answers(address, head + smuggled + CLOSE) == [(200, b"ok\n"), (200, b"ok\n")]


def test_an_unknown_verb_is_quoted_cut(address: tuple[str, int]) -> None:
    status, text = _post(address, "v" * 60_000, b"{}")
    assert status == 404 and len(text) < 2 * ECHO_CHARS and b"(60000 characters)" in text


@pytest.mark.parametrize("verb", ["filter", "prioritize", "prioritize-claims"])
def test_nodes_nested_1000_deep_get_a_400(tmp_path: Path, verb: str) -> None:
    """kube-scheduler without nodeCacheCapable sends whole Node objects: they are walked too (a
    cached node nested 1,000 deep failed the filter answer's encoding with a 500)."""
    snapshot = tmp_path / "one.json"
    items = [node_object("n1", gpus=8), inventory_object(profile_inventory("dgx-h100", "n1"))]
    snapshot.write_text(json.dumps(cluster_list(items)))
    built = build_snapshot_extender(snapshot)
    try:
        built.serve(host="127.0.0.1", port=0)
        assert built.server is not None
        node = node_object("n1", gpus=8)
        node["spec"]["deep"] = "@DEEP@"
        message = {"Pod": pod_object("p", limits={RESOURCE_GPU: 1}), "Nodes": {"items": [node]}}
        body = json.dumps(message).replace('"@DEEP@"', DEEP).encode()
        status, text = _post(("127.0.0.1", built.server.server_address[1]), verb, body)
    finally:
        built.close()
    assert status == 400 and b"deeper than" in text


def test_a_pod_checked_once_is_not_trusted_for_another_pod_with_its_uid(address: tuple[str, int]) -> None:
    """prioritize's pod equal to filter's skips the checks filter made; any other pod under the
    same UID (deeper, or not a pod message at all) is checked again."""
    pod = pod_object("same-uid", limits={RESOURCE_GPU: 1})
    first = _post(address, "filter", _filter_body(pod))
    assert first[0] == 200
    assert _post(address, "prioritize", _filter_body(pod)) == _post(address, "prioritize", _filter_body(pod))
    deeper = json.loads(json.dumps(pod))
    deeper["spec"]["affinity"] = "@DEEP@"
    body = json.dumps({"Pod": deeper, "NodeNames": NAMES[:2]}).replace('"@DEEP@"', DEEP).encode()
    for verb in ("filter", "prioritize"):
        status, text = _post(address, verb, body)
        assert status == 400 and b"deeper than" in text
    renamed = json.loads(json.dumps(pod))
    renamed["metadata"]["name"] = 7
    status, text = _post(address, "prioritize", json.dumps({"Pod": renamed, "NodeNames": NAMES[:2]}).encode())
    assert status == 400 and b"Pod.metadata.name" in text
    assert _post(address, "prioritize", json.dumps({"Pod": pod, "NodeNames": [1]}).encode())[0] == 400
    assert _post(address, "filter", _filter_body(pod)) == first
