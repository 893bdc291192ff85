"""Hostile input and load over real HTTP on 127.0.0.1: looping selectors, selectors that fail,
200 simultaneous binds, and a bind retried while the first is still writing the Binding."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from devicemodel.contracts import ANNOTATION_GPU_SELECTOR, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, assemble, build_core, build_snapshot_extender
from scheduler_ext.cluster.snapshot import load_snapshot
from scheduler_ext.kube import KubeBinder
from scheduler_ext.pods.selector import SelectorCache
from scheduler_ext.pods.selector_sandbox import SelectorSandbox
from tests.support.loopback_api import answer_json, loopback_api
from tests.support.waiting import wait_until

NODES = ["h100-a", "h100-b"]
LIST = "[" + ",".join(str(i) for i in range(300)) + "]"
THREE_NESTED = f"{LIST}.all(a, {LIST}.all(b, {LIST}.all(c, a + b + c >= 0)))"  # 27 million steps


def _snapshot(tmp_path: Path) -> Path:
    items: list[dict[str, Any]] = []
    for name in NODES:
        inventory = profile_inventory("p5.48xlarge", name)
        items += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory)]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return path


def _serve(built: Extender) -> str:
    built.serve(host="127.0.0.1", port=0)
    assert built.server is not None
    return f"127.0.0.1:{built.server.server_address[1]}"


def _post(address: str, verb: str, body: object, *, timeout: float = 30) -> tuple[int, Any]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("POST", f"/{verb}", body=json.dumps(body).encode())
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if response.status == 200 else data.decode()
    finally:
        connection.close()


def _get(address: str, path: str) -> int:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _filter(pod: dict[str, Any]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": NODES}


def _bind(name: str, node: str = "h100-a") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-default-{name}", "Node": node}


@pytest.fixture
def extender(tmp_path: Path) -> Iterator[tuple[Extender, str]]:
    built = build_snapshot_extender(_snapshot(tmp_path))
    try:
        yield built, _serve(built)
    finally:
        built.close()


def test_the_findings_selector_is_refused_at_once_on_every_verb(extender: tuple[Extender, str]) -> None:
    built, address = extender
    pod = pod_object("loop", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_GPU_SELECTOR: THREE_NESTED})
    status, result = _post(address, "filter", _filter(pod))
    assert status == 200 and result["NodeNames"] == []
    assert "the limit is 1,000,000" in result["FailedAndUnresolvableNodes"]["h100-a"]
    status, scores = _post(address, "prioritize", _filter(pod))
    assert status == 200 and {s["Score"] for s in scores} == {0}
    status, bound = _post(address, "bind", _bind("loop"))
    assert status == 200 and "1,000,000" in bound["Error"]
    assert built.core.selectors.sandbox.started == 0


@pytest.mark.parametrize("selector", ["1 / 0 == 1", "9223372036854775807 + 1 > 0", "[1].all(x, 1 / 0 == x)"])
def test_a_failing_selector_is_an_answer_on_every_verb(extender: tuple[Extender, str], selector: str) -> None:
    """The finding: ``1/0`` and an integer overflow answered 500 on filter, prioritize and bind."""
    built, address = extender
    pod = pod_object("fails", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_GPU_SELECTOR: selector})
    status, result = _post(address, "filter", _filter(pod))
    assert status == 200 and result["NodeNames"] == []
    assert "no GPU on the node matches" in result["FailedAndUnresolvableNodes"]["h100-a"]
    assert _post(address, "prioritize", _filter(pod))[0] == 200
    status, bound = _post(address, "bind", _bind("fails"))
    assert status == 200 and bound["Error"] and built.cache.holding("uid-default-fails") is None
    preempt = {"Pod": pod, "NodeNameToMetaVictims": {"h100-a": {"Pods": [], "NumPDBViolations": 0}}}
    assert _post(address, "preempt", preempt)[0] == 200


def test_a_selector_running_in_the_sandbox_holds_up_no_other_request(tmp_path: Path) -> None:
    """The finding's selector, let past the estimate and given a long deadline, runs for many
    seconds in a worker; meanwhile a plain pod is filtered and /healthz answers. Closing the
    sandbox kills the worker and the looping pod gets an in-band answer."""
    selectors = SelectorCache(cost_limit=10**12, sandbox=SelectorSandbox(deadline_s=600))
    built = build_snapshot_extender(_snapshot(tmp_path), selectors=selectors)
    address = _serve(built)
    looping = pod_object(
        "loop", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_GPU_SELECTOR: THREE_NESTED}
    )
    answers: list[tuple[int, Any]] = []
    thread = threading.Thread(target=lambda: answers.append(_post(address, "filter", _filter(looping))))
    try:
        thread.start()
        wait_until("the looping selector to run in the sandbox", lambda: selectors.sandbox.busy() == 1)
        status, result = _post(address, "filter", _filter(pod_object("plain", limits={RESOURCE_GPU: 2})))
        assert status == 200 and result["NodeNames"] == NODES
        assert _get(address, "/healthz") == 200
        assert thread.is_alive() and not answers  # the looping selector is still running
    finally:
        built.close()  # kills the busy worker
        thread.join(timeout=60)
    status, result = answers[0]
    assert status == 200 and "could not be evaluated" in result["FailedAndUnresolvableNodes"]["h100-a"]


def test_200_simultaneous_binds_all_get_an_answer(extender: tuple[Extender, str]) -> None:
    """The finding: with socketserver's backlog of 5, 166-181 of 200 connections were reset."""
    _, address = extender
    count = 200
    start = threading.Barrier(count)
    answers: list[object] = []

    def bind(index: int) -> None:
        start.wait()
        try:
            answers.append(_post(address, "bind", _bind(f"p{index}"), timeout=20)[0])
        except OSError as exc:
            answers.append(type(exc).__name__)

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [200] * count


class _SlowBindingApi(BaseHTTPRequestHandler):
    """The one API path KubeBinder uses: each Binding waits until the test releases it, then answers
    ``status``. There is no PATCH handler: a bind that patched the pod would fail here (501)."""

    protocol_version = "HTTP/1.1"
    arrived: ClassVar[threading.Event]
    release: ClassVar[threading.Event]
    bindings: ClassVar[list[str]]
    status: ClassVar[int]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.bindings.append(self.path)
        self.arrived.set()
        self.release.wait(60)
        self._answer(self.status, {"kind": "Status", "apiVersion": "v1", "code": self.status})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        answer_json(self, status, body)


def test_a_bind_retried_while_the_first_is_in_flight_gets_the_first_ones_result(tmp_path: Path) -> None:
    """The finding: the retry was answered success while the first call then failed, so the
    scheduler believed a pod bound that was not. Now the retry waits and reports the failure."""

    class Api(_SlowBindingApi):
        arrived = threading.Event()
        release = threading.Event()
        bindings: ClassVar[list[str]] = []
        status = 500

    api_handler = Api
    with loopback_api(api_handler) as api:
        cache, core = build_core()
        load_snapshot(_snapshot(tmp_path), cache)
        built = assemble(cache, core, KubeBinder(api))
        address = _serve(built)
        try:
            pod = pod_object("train", limits={RESOURCE_GPU: 4})
            assert _post(address, "filter", _filter(pod))[1]["NodeNames"] == NODES
            first: list[Any] = []
            retry: list[Any] = []
            calls = [
                threading.Thread(target=lambda: first.append(_post(address, "bind", _bind("train")))),
                threading.Thread(target=lambda: retry.append(_post(address, "bind", _bind("train")))),
            ]
            calls[0].start()
            assert api_handler.arrived.wait(30)
            calls[1].start()
            wait_until("the retry to wait", lambda: built.service.binds.waiting("uid-default-train") == 1)
            assert not retry  # not answered while the first call is in flight
            api_handler.release.set()
            for call in calls:
                call.join(timeout=60)
            assert first[0][0] == retry[0][0] == 200
            assert "HTTP 500" in first[0][1]["Error"] and retry[0][1] == first[0][1]
            assert len(api_handler.bindings) == 1 and cache.holding("uid-default-train") is None
            api_handler.status = 201  # the scheduler's next attempt succeeds and holds devices
            assert _post(address, "bind", _bind("train"))[1] == {"Error": ""}
            holding = cache.holding("uid-default-train")
            assert holding is not None and len(holding.record.devices) == 4
        finally:
            built.close()
