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


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["node-agent", "--kubelet-dir", "/k", "--state-dir", "/s", "--log-level=INFO"], "INFO"),
        (["--log-level", "DEBUG", "node-agent", "--kubelet-dir", "/k", "--state-dir", "/s"], "DEBUG"),
        (["--log-level", "DEBUG", "status", "--log-level", "ERROR"], "ERROR"),
        (["sim", "inject", "--state-dir", "/s", "--gpu", "1", "--xid", "79", "--log-level", "info"], "info"),
        (["status"], "WARNING"),
    ],
)
def test_log_level_is_taken_before_or_after_the_command(argv: list[str], level: str) -> None:
    """A chart's extraArgs come after `node-agent`: the flag must be accepted there too."""
    assert build_parser().parse_args(argv).log_level == level


def test_an_unknown_log_level_is_said_and_does_not_stop_the_command(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["inspect", "--simulate", "dgx1-v100", "--json", "--log-level", "CHATTY"]) == 0
    assert '"gpus"' in capsys.readouterr().out
    assert "unknown --log-level CHATTY; logging at WARNING" in caplog.text
