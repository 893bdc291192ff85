"""`gpuweave extender` argument errors are one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuweave.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["extender"], "give --kubeconfig FILE, --in-cluster or --snapshot FILE"),
        (["extender", "--listen", "nowhere", "--snapshot", "x"], "is not HOST:PORT"),
        (["extender", "--snapshot", "x", "--tls-cert", "c"], "--tls-cert and --tls-key go together"),
        (["extender", "--snapshot", "/no/such/file.yaml"], "cannot read snapshot /no/such/file.yaml"),
        (["extender", "--kubeconfig", "/no/such/kubeconfig"], "cannot load Kubernetes credentials"),
    ],
)
def test_bad_arguments_print_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_bad_tls_files_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "empty.json"
    snapshot.write_text('{"kind": "List", "items": []}')
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("not a certificate")
    key.write_text("not a key")
    argv = [
        "extender",
        "--listen",
        "127.0.0.1:0",
        "--snapshot",
        str(snapshot),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    ]
    assert main(argv) == 2
    assert f"cannot load TLS certificate {cert}" in capsys.readouterr().err
