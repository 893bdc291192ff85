"""The CUDA backend end to end against a fake ``libcuda.so.1`` (tests/support/fake_libcuda.c, built
here with the system C compiler): the real child process, the ctypes bindings and their argument
passing, the checks, the line protocol and the parent's deadline. The fake keeps device memory in
host memory and carries out the three kernels as their PTX says, so a stuck bit, a hung kernel, a
GPU that is not the one asked for and a missing peer path all come back as they would on a host."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hardware.exerciser.levels import plans
from hardware.exerciser.process import ProcessExerciser
from hardware.exerciser.protocol import CheckKind, ExercisePlan, ExerciseReport, ResultStatus
from tests.support.small_inventory import gpu_uuid, small_inventory

SOURCE = Path(__file__).resolve().parents[1] / "support" / "fake_libcuda.c"
INVENTORY = small_inventory(gpus=2)  # bus ids 00000000:10:00.0 and 00000000:11:00.0


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    root = tmp_path_factory.mktemp("driver")
    (root / "usr" / "lib64").mkdir(parents=True)
    library = root / "usr" / "lib64" / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE)], check=True)
    return root


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = ";".join(f"0000:{0x10 + i:02x}:00.0={gpu_uuid(i)}" for i in range(2))
    monkeypatch.setenv("FAKE_CUDA_GPUS", gpus)


def small_plan() -> ExercisePlan:
    (plan,) = plans(INVENTORY, INVENTORY.gpus, level_number=1, max_gpus=8)
    threads = {g.uuid: 1024 for g in INVENTORY.gpus}
    return replace(plan, copy_bytes=1 << 20, compute_threads=threads, compute_iterations=500)


def run(driver_root: Path, *, deadline_s: float = 60) -> ExerciseReport:
    return ProcessExerciser(driver_root=driver_root).run(small_plan(), deadline_s=deadline_s)


def by_key(report: ExerciseReport) -> dict[tuple[str, str], object]:
    return {(r.check.value, r.gpu): r for r in report.results}


def test_every_check_runs_through_the_driver_and_measures(driver_root: Path) -> None:
    report = run(driver_root)
    assert {r.status for r in report.results} == {ResultStatus.DONE}, report.results
    results = by_key(report)
    memory = results[("memory", gpu_uuid(0))]
    assert memory.mismatches == 0 and memory.bytes == int((1 << 30) * 0.02) // 4 * 4  # type: ignore[attr-defined]
    assert results[("compute", gpu_uuid(1))].answer_ok is True  # type: ignore[attr-defined]
    copies = [r for r in report.results if r.check in (CheckKind.HOST_TO_DEVICE, CheckKind.PEER)]
    assert copies and all(
        (r.gbps or 0) > 0 and r.bytes == (1 << 20) * small_plan().copy_repeats for r in copies
    )
    assert [(r.gpu, r.peer) for r in report.results if r.check is CheckKind.PEER] == [
        (gpu_uuid(0), gpu_uuid(1))
    ]


def test_a_stuck_bit_is_one_mismatch_at_its_word(driver_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_STUCK", "1:5")
    results = by_key(run(driver_root))
    bad = results[("memory", gpu_uuid(1))]
    assert (bad.mismatches, bad.first_bad_byte) == (1, 20)  # type: ignore[attr-defined]
    assert results[("memory", gpu_uuid(0))].mismatches == 0  # type: ignore[attr-defined]


def test_a_kernel_that_never_returns_is_killed_at_the_deadline(
    driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUDA_HANG", "gw_compute")
    started = time.monotonic()
    report = run(driver_root, deadline_s=3)
    assert time.monotonic() - started < 3 + 3
    results = by_key(report)
    for uuid in (gpu_uuid(0), gpu_uuid(1)):
        assert results[("memory", uuid)].status is ResultStatus.DONE  # type: ignore[attr-defined]
        assert results[("compute", uuid)].status is ResultStatus.TIMEOUT  # type: ignore[attr-defined]
        assert results[("d2h", uuid)].status is ResultStatus.NOT_RUN  # type: ignore[attr-defined]


def test_a_gpu_that_is_not_the_one_asked_for_is_refused(
    driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUDA_GPUS", f"0000:10:00.0={gpu_uuid(0)};0000:11:00.0={gpu_uuid(7)}")
    results = by_key(run(driver_root))
    refused = results[("memory", gpu_uuid(1))]
    assert refused.status is ResultStatus.ERROR  # type: ignore[attr-defined]
    assert f"is {gpu_uuid(7)}, not {gpu_uuid(1)}" in refused.detail  # type: ignore[attr-defined]
    assert results[("memory", gpu_uuid(0))].status is ResultStatus.DONE  # type: ignore[attr-defined]
    assert results[("p2p", gpu_uuid(0))].status is ResultStatus.ERROR  # type: ignore[attr-defined]


def test_no_peer_access_on_an_nvlink_pair_is_an_error(
    driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUDA_NO_PEER", "1")
    peer = by_key(run(driver_root))[("p2p", gpu_uuid(0))]
    assert peer.status is ResultStatus.ERROR and "no peer access" in peer.detail  # type: ignore[attr-defined]


def test_a_driver_that_will_not_initialise_fails_every_check_with_its_error(
    driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "100")
    report = run(driver_root)
    assert {r.status for r in report.results} == {ResultStatus.ERROR}
    assert "cuInit failed: CUDA_ERROR_NO_DEVICE (100)" in report.results[0].detail
