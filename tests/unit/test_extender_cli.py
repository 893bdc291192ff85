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
        (["extender", "--probe-listen", "nowhere", "--snapshot", "x"], "--probe-listen 'nowhere' is not"),
        (
            ["extender", "--snapshot", "x", "--workload", "/no/such/w.yaml"],
            "cannot read --workload /no/such/w.yaml",
        ),
        (["extender", "--snapshot", "x", "--gang-ttl", "-1"], "--gang-ttl -1.0 is outside 0..3600"),
        (["extender", "--snapshot", "x", "--gang-ttl", "nan"], "--gang-ttl nan is outside 0..3600"),
        (["extender", "--snapshot", "x", "--network-tier-labels", ", ,"], "names no label"),
        (["extender", "--snapshot", "x", "--network-tier-labels", "a,b,a"], "names a label twice"),
        (["extender", "--snapshot", "x", "--gang-hold-per-namespace", "0"], "per-namespace is '0'; give"),
        (
            ["extender", "--snapshot", "x", "--gang-expected-duration", "soon"],
            "--gang-expected-duration is 'soon'",
        ),
        (["extender", "--snapshot", "x", "--gang-max-tier-wait", "31d"], "--gang-max-tier-wait is 2678400 s"),
        (
            ["extender", "--snapshot", "x", "--gang-max-tier-wait", "2d"],
            "--gang-max-tier-wait 172800 s is outside",
        ),
        (
            ["extender", "--snapshot", "x", "--gang-tier-stretch", "0.5"],
            "--gang-tier-stretch 0.5 is outside 1..10",
        ),
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


def test_in_cluster_outside_a_pod_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["extender", "--in-cluster"]) == 2
    err = capsys.readouterr().err
    assert "cannot load Kubernetes credentials from the in-cluster service account" in err
    argv = [
        "node-agent",
        "--in-cluster",
        "--kubelet-dir",
        str(tmp_path),
        "--state-dir",
        str(tmp_path / "s"),
        "--simulate",
        "dgx1-v100",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "gpuweave node-agent: cannot load Kubernetes credentials from the in-cluster service account"
    )
    assert err.count("\n") == 1


def test_in_cluster_and_kubeconfig_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("extender", "node-agent"):
        with pytest.raises(SystemExit):
            main([command, "--in-cluster", "--kubeconfig", "k"])
        assert "not allowed with argument" in capsys.readouterr().err


def test_the_help_prints_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse %-formats help text: a literal percentage in it must not break ``--help``."""
    with pytest.raises(SystemExit) as exited:
        main(["extender", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--gang-hold-per-namespace GPUS|PERCENT%" in out
    assert "--gang-expected-duration DURATION" in out and "--gang-max-tier-wait DURATION" in out
