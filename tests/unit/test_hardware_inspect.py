"""`gpuweave inspect`: tables and topology matrix for simulated nodes, JSON that reloads as a profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from devicemodel.spec import NodeProfile
from gpuweave.cli import main
from hardware.profiles import load_profile


def test_dgx1_shows_the_cube_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--simulate", "dgx1-v100"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("GPU0 ")}
    assert rows["GPU0"][:8] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert "Tesla V100-SXM2-32GB" in out and "NUMA Affinity" in out and "Legend:" in out
    assert "CPU affinity: NUMA 0: CPUs 0-47" in out


def test_p5_lists_efa_with_verbs_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--simulate", "p5.48xlarge", "--node-name", "node-1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Node node-1: 8 GPUs, 32 NICs, 2 NUMA nodes")
    assert "NVSwitch fabric: GPUs 0,1,2,3,4,5,6,7, 18 NVLinks each" in out
    assert "/dev/infiniband/uverbs31" in out and "NIC31: rdmap" in out


def test_json_round_trips_as_a_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["inspect", "--simulate", "p4d.24xlarge", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["topology"]["columns"][:2] == ["GPU0", "GPU1"]
    assert set(document["numaCpus"]) == {"0", "1"}
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(document["profile"]), encoding="utf-8")
    assert load_profile(path).to_inventory() == load_profile("p4d.24xlarge").to_inventory()
    assert NodeProfile.parse(document["profile"]).name == "p4d.24xlarge"


def test_a_user_file_works_and_a_bad_one_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document = load_profile("a100-pcie-nvbridge-4").to_wire()
    good = tmp_path / "mine.yaml"
    good.write_text(yaml.safe_dump(document), encoding="utf-8")
    assert main(["inspect", "--simulate", str(good)]) == 0
    assert "NVLink pairs: 0-1x12 2-3x12" in capsys.readouterr().out
    document["spec"]["gpus"][2]["pcieSwitch"] = "sw7"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document), encoding="utf-8")
    assert main(["inspect", "--simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    problem = "spec.gpus[2].pcieSwitch: unknown PCIe switch 'sw7' (known: sw0, sw1)"
    assert err == f"gpuweave inspect: {bad}: {problem}\n"


def test_without_a_driver_the_host_read_fails_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this host has an NVIDIA driver; the no-driver path cannot be shown here")
    assert main(["inspect"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--simulate PROFILE|FILE" in err
