"""Replay: the simulator answers every recorded NVML call as the recorded machine did.

Each fixture under ``tests/fixtures/nvml/`` is one machine's NVML answers, written by
``scripts/gpu-check``. The simulator, configured as the same built-in profile with the same MIG
layout, must answer the same calls with the same shapes, units and errors (machine-dependent
values compared by form). ``pytest -k replay`` selects these tests.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from devicemodel.spec import NodeProfile
from gpuweave.gpucheck.record import record_fixture, replay
from hardware.nvml_fixture import Entry, dump, load
from tests.support.agent_process import REPO_ROOT
from tests.support.small_inventory import small_inventory

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "nvml"
RECORDED = sorted(FIXTURES.glob("*.json"))
SIMULATED_H100 = FIXTURES / "nvidia-h100-80gb-hbm3-550.90.07.json"


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_replay_of_each_recorded_fixture_matches_the_simulator(path: Path) -> None:
    assert replay(path) == []


def test_replay_fixtures_include_the_simulated_dgx_h100() -> None:
    assert SIMULATED_H100 in RECORDED


def test_replay_names_every_answer_the_simulator_gets_wrong(tmp_path: Path) -> None:
    meta, entries = load(SIMULATED_H100)
    answers: dict[tuple[str, tuple[object, ...]], dict[str, object]] = {
        ("nvmlDeviceGetMemoryInfo", ("gpu2",)): {"ok": {"total": 85899345920}},  # 81920 MiB: not an H100
        ("nvmlDeviceGetGpuFabricInfoV", ("gpu0",)): {"error": "NVML_ERROR_NOT_SUPPORTED"},
        ("nvmlDeviceGetUUID", ("gpu1",)): {"ok": "GPU-0123abcd-0000-4000-8000-000000000001"},  # same form
    }
    changed = [Entry(e.call, e.args, answers.get((e.call, e.args), e.answer)) for e in entries]
    changed.append(Entry("nvmlDeviceGetNvLinkState", ("gpu0", 99), {"error": "NVML_ERROR_INVALID_ARGUMENT"}))
    path = tmp_path / "changed.json"
    path.write_text(dump(meta, changed))
    problems = replay(path)
    assert len(problems) == 3, problems
    assert problems[0].startswith(
        "nvmlDeviceGetGpuFabricInfoV(gpu0): recorded {'error': 'NVML_ERROR_NOT_SUPPORTED'}, got {'ok': "
    )
    assert problems[1].startswith(
        "nvmlDeviceGetMemoryInfo(gpu2): recorded {'ok': {'total': 85899345920}}, got "
    )
    assert problems[2] == (
        "nvmlDeviceGetNvLinkState(gpu0, 99): recorded {'error': 'NVML_ERROR_INVALID_ARGUMENT'}, never asked"
    )


def test_replay_rebuilds_a_recorded_mig_layout(tmp_path: Path) -> None:
    profile = NodeProfile.from_inventory(small_inventory(gpus=4, mig_on=(2,)))
    profile_file = tmp_path / "mig.yaml"
    profile_file.write_text(yaml.safe_dump(profile.model_dump(mode="json", by_alias=True, exclude_none=True)))
    path = record_fixture(simulate=str(profile_file), out_dir=tmp_path)
    document = json.loads(path.read_text())
    assert document["mig"] == {"2": [{"profileId": 9, "start": 0}, {"profileId": 9, "start": 4}]}
    calls = {entry["call"] for entry in document["entries"]}
    assert {"nvmlComputeInstanceGetInfo", "nvmlDeviceGetMigDeviceHandleByIndex"} <= calls
    info = [e for e in document["entries"] if e["call"] == "nvmlComputeInstanceGetInfo"]
    assert info and all(e["ok"]["device"] == "parent" for e in info)  # NVML's parent GPU, not the MIG device
    assert replay(path) == []


def test_gpu_check_simulate_runs_every_step_and_writes_the_committed_fixture(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "gpu-check"), "--simulate", "dgx-h100", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("contract", "inspect", "agent", "record"):
        assert f"ok   {step}" in done.stdout, done.stdout
    written = tmp_path / SIMULATED_H100.name
    stale = "the committed fixture is stale: re-record it with scripts/gpu-check --simulate dgx-h100"
    assert written.read_text() == SIMULATED_H100.read_text(), stale


def test_fixtures_carry_no_serial_numbers_or_host_names() -> None:
    host = socket.gethostname()
    for path in RECORDED:
        text = path.read_text()
        assert "Serial" not in text and "BoardPartNumber" not in text
        assert f"\"{host}\"" not in text and f"{host}." not in text  # as a value or a domain name
