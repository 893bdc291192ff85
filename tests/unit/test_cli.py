from __future__ import annotations

import pytest

from gpuweave.cli import build_parser, main


def test_every_contract_command_is_registered() -> None:
    parser = build_parser()
    for command in ("simulate", "inspect", "node-agent", "publish", "extender", "sim", "mig"):
        args = parser.parse_args([command])
        assert callable(args.handler)


def test_unknown_command_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
