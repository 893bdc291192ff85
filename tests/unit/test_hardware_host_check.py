"""The node agent's start-up self-check against a fake host, and the manifest that satisfies it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from hardware.host_check import NVML_LIBRARY, run_self_check
from tests.support.agent_process import REPO_ROOT

MANIFEST = REPO_ROOT / "manifests" / "node-agent-daemonset.yaml"


def fake_host(root: Path, *, host_pid: bool = True, host_net: bool = True, nvidiactl: bool = True) -> Path:
    (root / "dev").mkdir(parents=True)
    if nvidiactl:
        (root / "dev" / "nvidiactl").write_text("")
    (root / "proc" / "2").mkdir(parents=True)
    (root / "proc" / "2" / "comm").write_text("kthreadd\n" if host_pid else "sleep\n")
    for pid, namespace in (("1", "net:[1]"), ("self", "net:[1]" if host_net else "net:[2]")):
        (root / "proc" / pid / "ns").mkdir(parents=True)
        os.symlink(namespace, root / "proc" / pid / "ns" / "net")
    return root


def loads(name: str) -> None:
    assert name == NVML_LIBRARY


def cannot_load(name: str) -> None:
    raise OSError(f"{name}: cannot open shared object file")


def test_a_complete_host_passes(tmp_path: Path) -> None:
    root = fake_host(tmp_path)
    check = run_self_check(root=root, load_library=loads, which=lambda _: "/usr/bin/nvidia-smi")
    assert check.missing == () and check.line() == ""


def test_everything_missing_is_named_in_one_line_fatal_first(tmp_path: Path) -> None:
    root = fake_host(tmp_path, host_pid=False, host_net=False, nvidiactl=False)
    check = run_self_check(root=root, load_library=cannot_load, which=lambda _: None)
    line = check.line()
    assert check.fatal and "\n" not in line
    names = [m.what for m in check.missing]
    assert names == [NVML_LIBRARY, "/dev/nvidiactl", "nvidia-smi", "hostPID", "hostNetwork"]
    assert line.index(NVML_LIBRARY) < line.index("/dev/nvidiactl") < line.index("hostPID")
    assert "runtimeClassName nvidia" in line and "NVIDIA_DRIVER_CAPABILITIES=utility" in line


def test_missing_host_pid_or_network_only_degrades(tmp_path: Path) -> None:
    root = fake_host(tmp_path, host_pid=False, host_net=False)
    check = run_self_check(root=root, load_library=loads, which=lambda _: "/usr/bin/nvidia-smi")
    assert not check.fatal
    assert [m.what for m in check.missing] == ["hostPID", "hostNetwork"]


def test_the_agent_without_a_driver_exits_with_the_self_check_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "gpuweave", "node-agent", "--kubelet-dir", str(tmp_path)]
    command += ["--state-dir", str(tmp_path / "state"), "--no-kube"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0
    assert last.startswith("gpuweave node-agent: node self-check: missing libnvidia-ml.so.1 (run the pod")


def test_the_daemonset_gives_the_agent_what_the_self_check_asks_for() -> None:
    pod = yaml.safe_load(MANIFEST.read_text())["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert container["securityContext"]["privileged"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev", "/run/nvidia-fabricmanager", "/var/lib/kubelet/device-plugins"} <= mounts


def test_the_image_does_not_ask_for_gpus_itself() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    instructions = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    assert not any("NVIDIA_VISIBLE_DEVICES" in line for line in instructions)
