"""The exerciser's backends on their failure paths: a hung or crashing child, a machine without
libcuda, DCGM's two JSON shapes and a hung ``dcgmi``, and the simulator's answers and faults."""

from __future__ import annotations

import ctypes.util
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from devicemodel.inventory import NodeInventory
from hardware.exerciser.dcgm import DcgmExerciser, dcgm_ids, parse_diag
from hardware.exerciser.levels import peer_pairs, plans
from hardware.exerciser.model import expectations
from hardware.exerciser.process import ProcessExerciser, child_env
from hardware.exerciser.protocol import (
    BANDWIDTH_CHECKS,
    CANCELLED,
    CheckKind,
    ExercisePlan,
    ExerciseReport,
    ResultStatus,
)
from hardware.profiles import load_profile
from hardware.simulated.exerciser import SimExerciserState, SimulatedExerciser
from hardware.simulated.health_calls import SimHealthState
from tests.support.small_inventory import gpu_uuid, small_inventory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
FAKE_CHILD = Path(__file__).resolve().parents[1] / "support" / "fake_exerciser_child.py"
INVENTORY = small_inventory(gpus=2)


def _plan(inventory: NodeInventory = INVENTORY) -> ExercisePlan:
    (plan,) = plans(inventory, inventory.gpus, level_number=1, max_gpus=8)
    return plan


def _by_status(report: ExerciseReport) -> dict[tuple[str, str], ResultStatus]:
    return {(r.check.value, r.gpu): r.status for r in report.results}


def test_a_hung_child_is_killed_at_the_deadline_and_only_the_checks_it_was_in_time_out() -> None:
    exerciser = ProcessExerciser(command=[sys.executable, str(FAKE_CHILD), "hang"])
    started = time.monotonic()
    report = exerciser.run(_plan(), deadline_s=2.0)
    assert time.monotonic() - started < 2.0 + 3.0  # the deadline plus the kill, not the hang
    status = _by_status(report)
    for uuid in (gpu_uuid(0), gpu_uuid(1)):
        assert status[("memory", uuid)] is ResultStatus.DONE
        assert status[("compute", uuid)] is ResultStatus.TIMEOUT
        assert status[("h2d", uuid)] is ResultStatus.NOT_RUN
    assert status[("p2p", gpu_uuid(0))] is ResultStatus.NOT_RUN
    hung = next(r for r in report.results if r.status is ResultStatus.TIMEOUT)
    assert "2 s deadline" in hung.detail
    assert len(report.results) == len(_plan().checks())


def test_a_crashed_child_fails_the_check_it_was_in_and_its_garbage_is_not_taken_as_results() -> None:
    report = ProcessExerciser(command=[sys.executable, str(FAKE_CHILD), "crash"]).run(_plan(), deadline_s=20)
    status = _by_status(report)
    assert status[("compute", gpu_uuid(0))] is ResultStatus.ERROR
    assert status[("compute", gpu_uuid(1))] is ResultStatus.NOT_RUN
    error = next(r for r in report.results if r.status is ResultStatus.ERROR)
    assert "exit 11" in error.detail and "corrupted state in the driver" in error.detail


def test_a_child_without_a_usable_driver_fails_every_check_with_its_reason() -> None:
    report = ProcessExerciser(command=[sys.executable, str(FAKE_CHILD), "fatal"]).run(_plan(), deadline_s=20)
    assert {r.status for r in report.results} == {ResultStatus.ERROR}
    assert all("CUDA_ERROR_NO_DEVICE" in r.detail for r in report.results)


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this machine has libcuda")
def test_the_real_child_without_libcuda_says_how_to_provide_it() -> None:
    report = ProcessExerciser().run(_plan(), deadline_s=60)
    assert {r.status for r in report.results} == {ResultStatus.ERROR}
    assert "cannot load libcuda.so.1" in report.results[0].detail
    assert "NVIDIA_DRIVER_CAPABILITIES" in report.results[0].detail


# --- DCGM ---------------------------------------------------------------------------------------

DCGM_GPUS = {0: "GPU-BBBBBBBB-0000-4000-8000-000000000001", 1: "GPU-aaaaaaaa-0000-4000-8000-000000000000"}


def test_dcgm_discovery_maps_uuids_to_dcgm_ids() -> None:
    ids = dcgm_ids((FIXTURES / "discovery.txt").read_text())
    assert ids == {
        "gpu-bbbbbbbb-0000-4000-8000-000000000001": 0,
        "gpu-aaaaaaaa-0000-4000-8000-000000000000": 1,
    }


def test_dcgm_4x_results_per_entity() -> None:
    results = parse_diag((FIXTURES / "diag-4x.json").read_text(), DCGM_GPUS)
    verdicts = {(r.gpu[:12], r.test): r.verdict for r in results}
    assert verdicts[("GPU-BBBBBBBB", "Hardware/memory")] == "fail"
    assert verdicts[("GPU-aaaaaaaa", "Hardware/memory")] == "pass"
    assert verdicts[("GPU-aaaaaaaa", "Integration/pcie")] == "warn"
    memory = next(r for r in results if r.verdict == "fail")
    assert "3 mismatches" in memory.detail
    skipped = next(r for r in results if r.test == "Integration/pcie" and r.gpu == DCGM_GPUS[0])
    assert skipped.status is ResultStatus.SKIPPED


def test_dcgm_3x_results_per_gpu_ids_and_deployment_results_for_every_gpu() -> None:
    results = parse_diag("dcgmi: some banner\n" + (FIXTURES / "diag-3x.json").read_text(), DCGM_GPUS)
    persistence = [r for r in results if r.test == "Deployment/Persistence Mode"]
    assert {r.gpu for r in persistence} == set(DCGM_GPUS.values())
    assert {r.verdict for r in persistence} == {"fail"}
    pcie = {r.gpu: r.verdict for r in results if r.test == "Integration/PCIe"}
    assert pcie == {DCGM_GPUS[0]: "pass", DCGM_GPUS[1]: "fail"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"}}', "host engine"),
        ("Error: unable to establish a connection", "no DCGM diagnostic"),
        ('{"DCGM Diagnostic": {"test_categories": "nonsense"}}', "unreadable"),
    ],
)
def test_dcgm_output_that_is_not_a_result_fails_every_gpu_closed(text: str, problem: str) -> None:
    results = parse_diag(text, DCGM_GPUS)
    assert [r.status for r in results] == [ResultStatus.ERROR, ResultStatus.ERROR]
    assert all(problem in r.detail for r in results)


def _fake_dcgmi(tmp_path: Path, *, diag: str) -> str:
    script = tmp_path / "dcgmi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n  discovery) cat {FIXTURES / "discovery.txt"} ;;\n  diag) {diag} ;;\nesac\n'
    )
    script.chmod(0o755)
    return str(script)


def _dcgm_plan() -> ExercisePlan:
    inventory = small_inventory(gpus=2)
    gpus = tuple(g.__class__(**{**g.__dict__, "uuid": DCGM_GPUS[1 - g.index]}) for g in inventory.gpus)
    inventory = NodeInventory(name="n", numa_nodes=1, gpus=gpus)
    return _plan(inventory)


def test_dcgm_runs_diag_at_the_plans_level_on_its_own_gpu_ids(tmp_path: Path) -> None:
    dcgmi = _fake_dcgmi(
        tmp_path, diag=f'echo "$@" > {tmp_path}/args; cat {FIXTURES / "diag-4x.json"}; exit 226'
    )
    exerciser = DcgmExerciser.find(which=lambda _name: dcgmi)
    assert exerciser is not None
    report = exerciser.run(_dcgm_plan(), deadline_s=20)
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", "1", "-j", "-i", "0,1"]
    failed = [r for r in report.results if r.verdict == "fail"]
    assert [r.gpu for r in failed] == [DCGM_GPUS[0]]


def test_dcgm_hung_past_the_deadline_is_killed_and_times_out_every_gpu(tmp_path: Path) -> None:
    dcgmi = _fake_dcgmi(tmp_path, diag="exec sleep 600")
    exerciser = DcgmExerciser.find(which=lambda _name: dcgmi)
    assert exerciser is not None
    started = time.monotonic()
    report = exerciser.run(_dcgm_plan(), deadline_s=1.0)
    assert time.monotonic() - started < 1.0 + 3.0
    assert {r.status for r in report.results} == {ResultStatus.TIMEOUT}


def test_dcgm_is_not_used_without_dcgmi_or_without_its_host_engine(tmp_path: Path) -> None:
    assert DcgmExerciser.find(which=lambda _name: None) is None
    refusing = tmp_path / "dcgmi"
    refusing.write_text("#!/bin/sh\necho 'Error: unable to connect to host engine' >&2\nexit 1\n")
    refusing.chmod(0o755)
    assert DcgmExerciser.find(which=lambda _name: str(refusing)) is None


# --- the simulator --------------------------------------------------------------------------------


def _simulated(profile: str) -> tuple[NodeInventory, SimulatedExerciser, SimHealthState]:
    inventory = load_profile(profile).to_inventory()
    health = SimHealthState([(g.uuid, g.pci_bus_id, 18) for g in inventory.gpus])
    return inventory, SimulatedExerciser(inventory, health, SimExerciserState(len(inventory.gpus))), health


def test_a_healthy_simulated_node_measures_its_models_rates() -> None:
    inventory, exerciser, _ = _simulated("dgx-h100")
    (plan,) = plans(inventory, inventory.gpus, level_number=1, max_gpus=8)
    report = exerciser.run(plan, deadline_s=10)
    assert {r.status for r in report.results} == {ResultStatus.DONE}
    peers = [r for r in report.results if r.check is CheckKind.PEER]
    assert len(peers) == 8 and {round(r.gbps or 0) for r in peers} == {382}  # 85 % of 18 x 25 GB/s
    h2d = {round(r.gbps or 0, 1) for r in report.results if r.check is CheckKind.HOST_TO_DEVICE}
    assert h2d == {53.6}  # 85 % of PCIe gen5 x16


def test_a_bad_cell_beyond_the_tested_share_of_memory_is_not_found_until_a_longer_level(
    tmp_path: Path,
) -> None:
    inventory, exerciser, _ = _simulated("dgx-h100")
    exerciser.state.add_bad_cell(2, 40 << 30)  # 40 GiB into an 80 GB GPU
    for level, found in ((1, 0), (3, 1)):
        (plan,) = plans(inventory, inventory.gpus, level_number=level, max_gpus=8)
        memory = {r.gpu: r for r in exerciser.run(plan, deadline_s=10).results if r.check is CheckKind.MEMORY}
        assert memory[inventory.gpu(2).uuid].mismatches == found
        assert sum(r.mismatches for r in memory.values()) == found


def test_simulated_faults_survive_in_their_file(tmp_path: Path) -> None:
    state = SimExerciserState(8, faults_file=tmp_path / "faults.json")
    state.add_bad_cell(3, 0x1000)
    state.slow_pair(1, 2)
    again = SimExerciserState(8, faults_file=tmp_path / "faults.json")
    assert again.bad_cells == {3: {0x1000}}
    assert again.slow_pairs == {frozenset((1, 2)): 0.5}


def test_a_simulated_hang_times_out_within_the_deadline_and_frees_its_thread() -> None:
    inventory, exerciser, _ = _simulated("dgx-h100")
    exerciser.state.hang(60, 4)
    (plan,) = plans(inventory, inventory.gpus, level_number=1, max_gpus=8)
    started = time.monotonic()
    report = exerciser.run(plan, deadline_s=0.5)
    assert time.monotonic() - started < 2.0
    status = _by_status(report)
    assert status[("memory", inventory.gpu(4).uuid)] is ResultStatus.TIMEOUT
    assert status[("compute", inventory.gpu(4).uuid)] is ResultStatus.NOT_RUN
    assert status[("d2h", inventory.gpu(5).uuid)] is ResultStatus.DONE
    assert {r.status for r in report.results if r.check is CheckKind.PEER} == {ResultStatus.NOT_RUN}


def test_expectations_follow_the_links_nvml_reports() -> None:
    inventory = load_profile("dgx1-v100").to_inventory()
    expected = expectations(inventory, {g.uuid: (3, 16) for g in inventory.gpus})
    assert round(expected.pcie[inventory.gpu(0).uuid] or 0, 2) == 15.76
    pair = next(p for p in peer_pairs(inventory, all_pairs=False) if p.lanes == 2)
    assert expected.peer_gbps(pair) == 50.0


def test_the_child_sees_every_gpu_by_bus_id_whatever_the_agent_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps")
    env = child_env()
    assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parents[2])


def _cancel_after(seconds: float) -> threading.Event:
    cancel = threading.Event()
    threading.Timer(seconds, cancel.set).start()
    return cancel


def test_a_cancelled_child_is_killed_at_once_and_its_checks_are_not_run_not_hung() -> None:
    exerciser = ProcessExerciser(command=[sys.executable, str(FAKE_CHILD), "hang"])
    started = time.monotonic()
    report = exerciser.run(_plan(), deadline_s=60.0, cancel=_cancel_after(1.0))
    assert time.monotonic() - started < 1.0 + 3.0  # the cancel plus the kill, not the deadline
    status = _by_status(report)
    assert status[("memory", gpu_uuid(0))] is ResultStatus.DONE  # measured before: kept
    assert status[("compute", gpu_uuid(0))] is ResultStatus.NOT_RUN  # begun, cancelled: not hung
    assert ResultStatus.TIMEOUT not in set(status.values())
    assert any(r.detail == CANCELLED for r in report.results)


def test_a_cancelled_dcgm_diag_is_killed_and_runs_nothing(tmp_path: Path) -> None:
    dcgmi = _fake_dcgmi(tmp_path, diag="exec sleep 600")
    exerciser = DcgmExerciser.find(which=lambda _name: dcgmi)
    assert exerciser is not None
    started = time.monotonic()
    report = exerciser.run(_dcgm_plan(), deadline_s=60.0, cancel=_cancel_after(0.5))
    assert time.monotonic() - started < 0.5 + 3.0
    assert {r.status for r in report.results} == {ResultStatus.NOT_RUN}


def test_dcgm_runs_its_pcie_test_for_a_bandwidth_plan() -> None:
    exerciser = DcgmExerciser("dcgmi", {})
    command, _ = exerciser.command(replace(_dcgm_plan(), gpu_checks=BANDWIDTH_CHECKS))
    assert command[2:4] == ["-r", "pcie"]


def test_a_cancelled_simulated_run_returns_at_once_with_nothing_hung() -> None:
    inventory, exerciser, _ = _simulated("dgx-h100")
    exerciser.state.hang(600, 0)
    started = time.monotonic()
    report = exerciser.run(_plan(inventory), deadline_s=60.0, cancel=_cancel_after(0.3))
    assert time.monotonic() - started < 3.0
    assert ResultStatus.TIMEOUT not in {r.status for r in report.results}
    assert {r.status for r in report.for_gpu(inventory.gpus[0].uuid)} == {ResultStatus.NOT_RUN}
