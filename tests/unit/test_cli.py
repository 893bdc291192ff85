from __future__ import annotations

import argparse

import pytest

from gpuweave.cli import build_parser, main

CONTRACT_COMMANDS = ("simulate", "inspect", "node-agent", "publish", "extender", "sim", "mig", "status")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("gpuweave has no sub-commands")


def test_every_contract_command_is_registered_with_a_handler() -> None:
    commands = _subcommands(build_parser())
    assert set(CONTRACT_COMMANDS) <= set(commands)
    for name in CONTRACT_COMMANDS:
        assert commands[name].get_default("handler") is not None or _subcommands(commands[name])


def test_unknown_command_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
