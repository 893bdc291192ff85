"""``gpuweave node-agent --pod-resources-socket``: the default rule and turning it off."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuweave.cli import build_parser
from gpuweave.commands.node_agent import open_pod_resources


def socket_for(*argv: str) -> Path | None:
    args = build_parser().parse_args(["node-agent", *argv])
    client = open_pod_resources(args)
    return client.socket_path if client is not None else None


def test_default_is_the_kubelets_socket_beside_the_device_plugin_directory() -> None:
    assert socket_for() == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert socket_for("--kubelet-dir", "/data/kubelet/device-plugins") == Path(
        "/data/kubelet/pod-resources/kubelet.sock"
    )


def test_a_directory_of_another_shape_gives_no_default(caplog: pytest.LogCaptureFixture) -> None:
    assert socket_for("--kubelet-dir", "/tmp/plugins") is None
    assert "no kubelet pod-resources socket" in caplog.text


@pytest.mark.parametrize("off", ["none", "NONE", ""])
def test_none_turns_it_off(off: str) -> None:
    assert socket_for("--pod-resources-socket", off) is None


def test_an_explicit_path_wins() -> None:
    assert socket_for("--kubelet-dir", "/tmp/plugins", "--pod-resources-socket", "/run/pr.sock") == Path(
        "/run/pr.sock"
    )
