"""`gpuweave node-agent --dra`: the command line is checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuweave.cli import main
from gpuweave.node.dra import kubelet_root


def _agent(tmp_path: Path, *extra: str) -> list[str]:
    kubelet = tmp_path / "kubelet" / "device-plugins"
    kubelet.mkdir(parents=True)
    return [
        "node-agent",
        "--simulate",
        "dgx-h100",
        "--kubelet-dir",
        str(kubelet),
        "--state-dir",
        str(tmp_path / "s"),
        *extra,
    ]


def test_dra_needs_an_api_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_agent(tmp_path, "--no-kube", "--dra")) != 0
    assert "--dra reads ResourceClaims" in capsys.readouterr().err


def test_dra_needs_cdi_specs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    assert (
        main(
            _agent(
                tmp_path,
                "--kubeconfig",
                str(kubeconfig),
                "--dra",
                "--cdi-spec-dir",
                "none",
                "--device-list-strategy",
                "envvar",
            )
        )
        != 0
    )
    assert "--cdi-spec-dir cannot be none" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kubelet_dir", "given", "root"),
    [
        ("/var/lib/kubelet/device-plugins", None, "/var/lib/kubelet"),
        ("/srv/kubelet", None, "/srv/kubelet"),
        ("/var/lib/kubelet/device-plugins", "/other", "/other"),
    ],
)
def test_kubelet_root(kubelet_dir: str, given: str | None, root: str) -> None:
    class Args:
        pass

    args = Args()
    args.kubelet_dir, args.kubelet_root = Path(kubelet_dir), given  # type: ignore[attr-defined]
    assert kubelet_root(args) == Path(root)  # type: ignore[arg-type]
