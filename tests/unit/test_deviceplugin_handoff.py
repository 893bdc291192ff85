"""The handoff's admission order (bound resourceVersion), its catch-up wait, and the backstop's comparison."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from deviceplugin.handoff import HandoffMatcher, PodView, admission_ranks, corrections
from deviceplugin.preferred import PreferenceRequest
from nodeagent.metrics import AgentMetrics
from tests.support.small_inventory import gpu_uuid


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def annotation(devices: dict[str, list[str]], *, node: str = "node-a") -> str:
    return PodAssignment(node=node, containers={"main": ContainerAssignment(devices=devices)}).to_annotation()


def bind(view: PodView, uid: str, ids: list[str], *, rv: str, phase: str = "Pending") -> None:
    view.upsert(
        uid=uid,
        namespace="ml",
        name=uid,
        phase=phase,
        annotation=annotation({RESOURCE_GPU: ids}),
        resource_version=rv,
    )


def request(size: int = 1) -> PreferenceRequest:
    return PreferenceRequest(RESOURCE_GPU, tuple(gpu_uuid(i) for i in range(4)), (), size)


def outcome(metrics: AgentMetrics, name: str) -> float | None:
    labels = {"resource": RESOURCE_GPU, "outcome": name}
    return metrics.registry.get_sample_value("gpuweave_deviceplugin_handoff_total", labels)


def test_a_burst_is_served_in_bound_order_not_arrival_order() -> None:
    view = PodView()
    matcher = HandoffMatcher(view, node="node-a", metrics=AgentMetrics(), catch_up_s=0)
    bind(view, "burst-0", [gpu_uuid(0)], rv="1000")
    bind(view, "burst-1", [gpu_uuid(1)], rv="1030")
    bind(view, "burst-2", [gpu_uuid(2)], rv="1020")
    bind(view, "burst-3", [gpu_uuid(3)], rv="1010")
    served = [matcher.hint(request(), {}) for _ in range(4)]
    assert served == [[gpu_uuid(0)], [gpu_uuid(3)], [gpu_uuid(2)], [gpu_uuid(1)]]


def test_the_bound_resource_version_is_the_first_one_seen() -> None:
    view = PodView()
    bind(view, "a", [gpu_uuid(0)], rv="50")
    bind(view, "b", [gpu_uuid(1)], rv="60")
    bind(view, "a", [gpu_uuid(0)], rv="70")  # a later update of a (a status write) keeps its place
    # a re-list (kubeio.listwatch hands it on as MODIFIED / ADDED) shows current resourceVersions
    bind(view, "b", [gpu_uuid(1)], rv="90")
    bind(view, "a", [gpu_uuid(0)], rv="91")
    bind(view, "c", [gpu_uuid(2)], rv="80")  # unknown before the re-list: its current one
    pods = {p.uid: p for p in view.pending()}
    assert {uid: p.bound for uid, p in pods.items()} == {"a": "50", "b": "60", "c": "80"}
    assert pods["a"].resource_version == "91"  # the precondition of a correction is the latest


def test_opaque_resource_versions_fall_back_to_arrival_order() -> None:
    view = PodView()
    bind(view, "x", [gpu_uuid(0)], rv="zz9")
    bind(view, "y", [gpu_uuid(1)], rv="1")
    ranks = admission_ranks(view.pending())
    assert ranks["x"] < ranks["y"]


def test_a_pod_the_view_never_shows_is_waited_for_at_most_the_catch_up() -> None:
    view, metrics = PodView(), AgentMetrics()
    matcher = HandoffMatcher(view, node="node-a", metrics=metrics, catch_up_s=0.05)
    bind(view, "running", [gpu_uuid(0)], rv="5", phase="Running")
    assert matcher.hint(request(), {}) is None  # a pod the extender did not place: no hint
    assert outcome(metrics, "waited") == 1
    assert outcome(metrics, "no_assignment") == 1


def test_after_a_quiet_spell_the_watch_is_waited_for_until_the_pod_shows() -> None:
    view, metrics = PodView(), AgentMetrics()
    matcher = HandoffMatcher(view, node="node-a", metrics=metrics, catch_up_s=30)
    late = threading.Timer(0.1, bind, args=(view, "late", [gpu_uuid(2)]), kwargs={"rv": "9"})
    late.start()  # nothing arrived before: the kubelet's watch is ahead of this agent's
    try:
        assert matcher.hint(request(), {}) == [gpu_uuid(2)]
    finally:
        late.join()


def test_a_busy_watch_is_waited_for_until_the_pod_shows() -> None:
    clock = FakeClock()  # never advances: only the pod's arrival ends the wait
    view, metrics = PodView(), AgentMetrics()
    matcher = HandoffMatcher(view, node="node-a", metrics=metrics, catch_up_s=30, clock=clock)
    bind(view, "done", [gpu_uuid(0)], rv="5", phase="Running")  # the watch just delivered something
    late = threading.Thread(target=bind, args=(view, "late", [gpu_uuid(2)]), kwargs={"rv": "9"})
    late.start()
    try:
        assert matcher.hint(request(), {}) == [gpu_uuid(2)]
    finally:
        late.join()


def test_corrections_name_the_kubelets_devices() -> None:
    view = PodView()
    bind(view, "p", [gpu_uuid(0), gpu_uuid(1)], rv="7", phase="Running")
    bind(view, "q", [gpu_uuid(2)], rv="8")
    held = {
        ("ml", "p"): {"main": {RESOURCE_GPU: frozenset({gpu_uuid(1), gpu_uuid(3)})}},
        ("ml", "q"): {"main": {RESOURCE_GPU: frozenset({gpu_uuid(2)})}},
    }
    (found,) = corrections(view.assigned(), held)
    assert found.pod.uid == "p" and found.devices_differ
    assert found.corrected.containers["main"].devices[RESOURCE_GPU] == sorted([gpu_uuid(1), gpu_uuid(3)])
    assert found.corrected.node == "node-a"


def test_share_units_of_the_same_gpu_are_corrected_but_are_no_mismatch() -> None:
    view = PodView()
    units = [f"{gpu_uuid(1)}::compute-{k}" for k in (0, 1)]
    view.upsert(
        uid="s",
        namespace="ml",
        name="s",
        phase="Running",
        annotation=annotation({RESOURCE_GPU_COMPUTE: units}),
        resource_version="3",
    )
    real = frozenset(f"{gpu_uuid(1)}::compute-{k}" for k in (4, 5))
    (found,) = corrections(view.assigned(), {("ml", "s"): {"main": {RESOURCE_GPU_COMPUTE: real}}})
    assert not found.devices_differ
    assert found.corrected.containers["main"].devices[RESOURCE_GPU_COMPUTE] == sorted(real)


def test_terminal_pods_and_unlisted_containers_are_not_compared() -> None:
    view = PodView()
    bind(view, "gone", [gpu_uuid(0)], rv="1", phase="Succeeded")
    bind(view, "waiting", [gpu_uuid(1)], rv="2")
    held = {("ml", "gone"): {"main": {RESOURCE_GPU: frozenset({gpu_uuid(3)})}}}
    assert corrections(view.assigned(), held) == []


def test_correct_assignments_without_an_api_server_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuweave.cli import main  # noqa: PLC0415

    argv = ["node-agent", "--kubelet-dir", str(tmp_path), "--simulate", "dgx-h100", "--correct-assignments"]
    assert main([*argv, "--no-kube"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--correct-assignments patches pods" in err
