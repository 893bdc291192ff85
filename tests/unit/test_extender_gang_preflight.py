"""Gang preflight in the extender: a multi-node gang's members wait until every member node proved
the GPUs planned there; a node that fails (or does not answer) is avoided and the gang is planned
elsewhere; GPUs that passed recently are not asked again; a gang on one node asks nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from scheduler_ext.app import Extender
from scheduler_ext.kueue.checks import PodSetNeed, free_gpus_by_node, parse_workload, placement_nodes
from scheduler_ext.kueue.controller import KueueChecks
from scheduler_ext.preflight.book import GangPreflight, Phase, PreflightBook, PreflightRequest
from tests.unit.test_extender_gangs import (
    NODES,
    Clock,
    _bind,
    _busy,
    _extender,
    _filter,
    _gang,
    _nodes,
    _slot_devices,
)


class Port:
    """Where the book's requests go (the API server's GpuPreflight objects in a cluster)."""

    def __init__(self) -> None:
        self.created: list[PreflightRequest] = []
        self.deleted: list[str] = []

    def create(self, request: PreflightRequest) -> None:
        self.created.append(request)

    def delete(self, name: str) -> None:
        self.deleted.append(name)

    def on(self, node: str) -> PreflightRequest:
        return [r for r in self.created if r.node == node][-1]


def with_preflight(
    tmp_path: Path, clock: Clock, *, serves: frozenset[str] = frozenset(NODES)
) -> tuple[Extender, PreflightBook, Port]:
    extender = _extender(tmp_path, clock, _nodes())
    port = Port()
    book = PreflightBook(port, serves=lambda node: node in serves, clock=clock, timeout_s=30)
    assert extender.gangs is not None
    extender.gangs.preflight = book
    return extender, book, port


def answer(book: PreflightBook, request: PreflightRequest, phase: Phase, reason: str = "") -> None:
    passed = request.gpus if phase is Phase.PASSED else ()
    book.result(request.name, phase, reason, passed_gpus=passed)


def waiting_reason(extender: Extender, pod: dict[str, Any]) -> str:
    """Why the member is not placed now: an error, so kube-scheduler retries it on its back-off
    (a rejection would park it until some plugin's event, or five minutes)."""
    result = _filter(extender.service, pod)
    assert not result.NodeNames and not result.FailedAndUnresolvableNodes and result.Error
    return result.Error


def test_members_wait_for_every_node_to_pass_then_go_to_their_planned_nodes(tmp_path: Path) -> None:
    clock = Clock()
    extender, book, port = with_preflight(tmp_path, clock)
    _busy(extender, "a2", 4)
    first, second = _gang(extender, "train", size=2)
    assert "waiting for the preflight of its GPUs on node(s) b1, b2" in waiting_reason(extender, first)
    assert {r.node for r in port.created} == {"b1", "b2"}
    assert all(len(r.gpus) == 8 and r.requester == "ml/gang:train" for r in port.created)
    assert "waiting for the preflight" in waiting_reason(extender, second)  # asked once per node
    assert len(port.created) == 2
    answer(book, port.on("b1"), Phase.PASSED)
    assert "on node(s) b2" in waiting_reason(extender, first)
    answer(book, port.on("b2"), Phase.PASSED)
    assert {_bind(extender.service, first), _bind(extender.service, second)} == {"b1", "b2"}
    assert set(port.deleted) == {r.name for r in port.created}  # the gang started: its objects go


def test_a_failed_node_is_avoided_and_the_gang_is_planned_elsewhere(tmp_path: Path) -> None:
    clock = Clock()
    extender, book, port = with_preflight(tmp_path, clock)
    _busy(extender, "a2", 4)
    first, second = _gang(extender, "train", size=2)
    waiting_reason(extender, first)
    answer(book, port.on("b2"), Phase.PASSED)
    answer(book, port.on("b1"), Phase.FAILED, "1 GPU(s) failed: NVLink copies at 191.2 GB/s")
    reason = waiting_reason(extender, second)
    why = "preflight failed on node b1 (1 GPU(s) failed: NVLink copies at 191.2 GB/s); placing it elsewhere"
    assert why in reason
    assert _slot_devices(extender) == 0  # the plan and its held devices went
    assert book.avoided("ml/gang:train") == {"b1"}
    waiting_reason(extender, first)  # planned again: without b1, across blocks now
    again = port.created[2:]
    assert [r.node for r in again] != [] and "b1" not in {r.node for r in again}
    assert "b2" not in {r.node for r in again}  # b2's GPUs passed a moment ago: not asked again
    for request in again:
        answer(book, request, Phase.PASSED)
    nodes = {_bind(extender.service, first), _bind(extender.service, second)}
    assert "b1" not in nodes and len(nodes) == 2


def test_a_node_that_does_not_answer_in_time_counts_as_failed(tmp_path: Path) -> None:
    clock = Clock()
    extender, book, port = with_preflight(tmp_path, clock)
    first, _ = _gang(extender, "train", size=2)
    waiting_reason(extender, first)
    answer(book, port.created[0], Phase.PASSED)
    clock.now += 31  # inside the gang's 60 s reservation
    assert "no answer within 30 s" in waiting_reason(extender, first)
    assert book.avoided("ml/gang:train") == {port.created[1].node}


def test_nodes_whose_agent_serves_no_preflight_are_not_asked(tmp_path: Path) -> None:
    extender, _, port = with_preflight(tmp_path, Clock(), serves=frozenset())
    first, second = _gang(extender, "train", size=2)
    assert len({_bind(extender.service, first), _bind(extender.service, second)}) == 2
    assert port.created == []


def test_a_gang_on_one_node_asks_nothing(tmp_path: Path) -> None:
    extender, _, port = with_preflight(tmp_path, Clock())
    first, second = _gang(extender, "small", size=2, gpus=4)
    assert _bind(extender.service, first) == _bind(extender.service, second)
    assert port.created == []


def test_book_verdicts_without_an_extender() -> None:
    clock, port = Clock(), Port()
    book = PreflightBook(port, serves=lambda _n: True, clock=clock, fresh_s=600)
    nodes = {"n1": {"GPU-1", "GPU-2"}, "n2": {"GPU-3"}}
    assert book.check("ns/g", nodes) == GangPreflight("pending", pending=("n1", "n2"))
    for request in list(port.created):
        answer(book, request, Phase.PASSED)
    assert book.check("ns/g", nodes).state == "passed"
    book.forget("ns/g")
    clock.now += 599
    assert book.check("ns/other", nodes).state == "passed"  # fresh passes cover another gang too
    clock.now += 2
    assert book.check("ns/later", nodes).state == "pending"  # ... for fresh_s only
    assert book.check("ns/g", {"n1": {"GPU-1"}}).state == "passed"  # one node: nothing to prove


def test_kueue_placement_names_the_nodes_its_best_fit_takes() -> None:
    free = {"a": 8, "b": 8, "c": 4, "d": 2}
    needs = [PodSetNeed("workers", 2, 8, None), PodSetNeed("launcher", 1, 2, None)]
    assert placement_nodes(needs, free) == {"a": 8, "b": 8, "d": 2}
    assert placement_nodes([PodSetNeed("w", 2, 4, frozenset({"a", "c"}))], free) == {"c": 4, "a": 4}


def _workload(pods: int, gpus: int) -> dict[str, Any]:
    container = {"name": "main", "image": "train", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "metadata": {"name": "train", "namespace": "ml", "resourceVersion": "1"},
        "spec": {
            "podSets": [{"name": "workers", "count": pods, "template": {"spec": {"containers": [container]}}}]
        },
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admission": {"clusterQueue": "gpus", "podSetAssignments": [{"name": "workers", "count": pods}]},
            "admissionChecks": [{"name": "gpu-health", "state": "Pending"}],
        },
    }


def test_the_kueue_check_turns_ready_only_once_the_workloads_nodes_passed(tmp_path: Path) -> None:
    clock = Clock()
    extender, book, port = with_preflight(tmp_path, clock)
    _busy(extender, "a2", 4)
    checks = KueueChecks(extender.cache, client.ApiClient())  # no call reaches the API here
    checks.preflight = book
    workload = parse_workload(_workload(2, 8))

    def verdict() -> Any:
        free = checks._not_avoided(workload, free_gpus_by_node(extender.cache.states()))
        return checks._admission_verdict(workload, {}, free)

    first = verdict()
    assert first.state == "Pending" and "waiting for the preflight of its GPUs" in first.message
    asked = {r.node for r in port.created}
    assert len(asked) == 2 and all(len(r.gpus) == 8 for r in port.created)
    failed = sorted(asked)[0]
    for request in list(port.created):
        answer(book, request, Phase.FAILED if request.node == failed else Phase.PASSED)
    second = verdict()
    assert second.state == "Pending" and f"preflight failed on node {failed}" in second.message
    assert book.avoided("ml/train") == {failed}
    third = verdict()  # the fit goes elsewhere; the node that passed is fresh, one new node is asked
    assert third.state == "Pending"
    again = [r for r in port.created if r.node not in asked]
    assert len(again) == 1 and failed not in {r.node for r in port.created[len(asked) :]}
    answer(book, again[0], Phase.PASSED)
    assert verdict().state == "Ready"
