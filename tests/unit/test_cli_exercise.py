"""`gpuweave exercise`: the active check of the GPUs a container was given, judged as the agent
judges them; a GPU named without its device node fails closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuweave.cli import main
from hardware.profiles import load_profile

INVENTORY = load_profile("p5.48xlarge").to_inventory(node_name="n1")


def devices(root: Path, *indexes: int) -> Path:
    for index in indexes:
        node = root / INVENTORY.gpu(index).device_node.lstrip("/")
        node.parent.mkdir(parents=True, exist_ok=True)
        node.touch()
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(["exercise", "--simulate", "p5.48xlarge", "--node-name", "n1", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_the_visible_gpus_are_exercised_and_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    visible = [INVENTORY.gpu(i).uuid for i in (3, 4)]
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", ",".join(visible))
    code, outcome = run(capsys, "--dev-root", str(devices(tmp_path, 3, 4)))
    assert code == 0
    gpus = outcome["gpus"]
    assert isinstance(gpus, dict) and sorted(gpus) == sorted(visible)
    assert {g["verdict"] for g in gpus.values()} == {"passed"}
    results = outcome["results"]
    assert isinstance(results, list) and {r["check"] for r in results} == {
        "memory",
        "compute",
        "h2d",
        "d2h",
        "p2p",
    }


def test_a_named_gpu_without_its_device_node_fails_closed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", f"{INVENTORY.gpu(0).uuid},{INVENTORY.gpu(1).uuid}")
    code, outcome = run(capsys, "--dev-root", str(devices(tmp_path, 0)), "--checks", "bandwidth")
    assert code == 1
    gpus = outcome["gpus"]
    assert isinstance(gpus, dict)
    assert gpus[INVENTORY.gpu(0).uuid]["verdict"] == "passed"
    missing = gpus[INVENTORY.gpu(1).uuid]
    assert missing["verdict"] == "failed" and "/dev/nvidia1 is not in this container" in missing["reasons"][0]


def test_a_gpu_not_on_the_node_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["exercise", "--simulate", "p5.48xlarge", "--gpu", "GPU-nope", "--dev-root", str(tmp_path)])
    assert code == 2
    assert "GPU GPU-nope is not on this node" in capsys.readouterr().err
