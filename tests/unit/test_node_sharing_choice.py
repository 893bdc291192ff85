"""Which sharing configuration a node agent serves: the named one its Node's label picks, or the
default; a label naming no configuration, or a Node the API server will not show, stops the start
in one line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.sharing import load_sharing_plan, named_sharing_configs
from gpuweave.cli import build_parser
from gpuweave.node.sharing import LABEL_READ_ATTEMPTS, check_sharing_arguments, chosen_sharing_config

LABEL = "gpuweave.io/sharing-config"


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return build_parser().parse_args(
        ["node-agent", "--kubelet-dir", str(tmp_path), "--state-dir", str(tmp_path), *extra]
    )


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    directory = tmp_path / "sharing"
    directory.mkdir()
    (directory / "inference.yaml").write_text("default: {mode: fractional}\n")
    (directory / "notebooks.yaml").write_text("default: {mode: time-sliced, replicas: 8}\n")
    (directory / "README").write_text("not a configuration\n")
    (tmp_path / "default.yaml").write_text("gpus: {'7': {mode: time-sliced}}\n")
    return directory


def test_the_nodes_label_picks_its_named_configuration(tmp_path: Path, configs: Path) -> None:
    default = str(tmp_path / "default.yaml")
    args = _args(tmp_path, "--sharing-config-dir", str(configs), "--sharing-config", default)
    assert named_sharing_configs(configs) == ["inference", "notebooks"]
    chosen = chosen_sharing_config(args, labels=lambda: {LABEL: "notebooks", "other": "x"})
    assert chosen == configs / "notebooks.yaml"
    assert chosen is not None and load_sharing_plan(chosen).default.replicas == 8
    assert chosen_sharing_config(args, labels=lambda: {"other": "x"}) == tmp_path / "default.yaml"
    assert chosen_sharing_config(_args(tmp_path), labels=lambda: {LABEL: "notebooks"}) is None


@pytest.mark.parametrize("value", ["inferense", "../default", "notebooks.yaml", "x" * 300])
def test_a_label_naming_no_configuration_is_refused_naming_those_there(
    tmp_path: Path, configs: Path, value: str
) -> None:
    args = _args(tmp_path, "--sharing-config-dir", str(configs))
    there = r"names no sharing configuration .*\(there: inference, notebooks\)"
    with pytest.raises(InvalidInputError, match=there):
        chosen_sharing_config(args, labels=lambda: {LABEL: value})


def test_an_api_server_that_does_not_answer_is_tried_again_then_stops_the_start(
    tmp_path: Path, configs: Path
) -> None:
    args = _args(tmp_path, "--sharing-config-dir", str(configs))
    calls: list[int] = []
    waits: list[float] = []

    def down() -> dict[str, str]:
        calls.append(1)
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(GpuweaveError, match=r"cannot read the node's gpuweave\.io/sharing-config label"):
        chosen_sharing_config(args, labels=down, sleep=waits.append)
    assert len(calls) == LABEL_READ_ATTEMPTS and waits == [1.0, 2.0, 4.0, 8.0, 15.0]
    answers = iter([OSError("reset"), {LABEL: "inference"}])

    def flaky() -> dict[str, str]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert chosen_sharing_config(args, labels=flaky, sleep=waits.append) == configs / "inference.yaml"


def test_the_directory_needs_the_api_server_and_must_exist(tmp_path: Path, configs: Path) -> None:
    with pytest.raises(GpuweaveError, match=r"needs the Node's gpuweave\.io/sharing-config label"):
        check_sharing_arguments(_args(tmp_path, "--sharing-config-dir", str(configs)), with_kube=False)
    with pytest.raises(GpuweaveError, match="is not a directory"):
        check_sharing_arguments(_args(tmp_path, "--sharing-config-dir", str(tmp_path / "no")), with_kube=True)
    check_sharing_arguments(_args(tmp_path, "--sharing-config-dir", str(configs)), with_kube=True)
