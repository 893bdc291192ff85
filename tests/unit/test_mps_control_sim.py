"""The simulated nvidia-cuda-mps-control as a program: -d, the control client, files (pytest -k mps)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import SharingMode, load_sharing_plan
from deviceplugin.mps import HOST_BASE_DIR, MpsSettings, MpsSupervisor
from hardware.mps import MpsControlError, MpsDaemonSpec, ProcessMpsDaemons, read_pid, simulated_command
from hardware.simulated import mps_control
from hardware.simulated.health_inject import apply_request, parse_request
from hardware.simulated.node import SimulatedNode
from tests.support.agent_process import remove_tree, short_temp_dir
from tests.support.small_inventory import small_inventory
from tests.support.waiting import poll_until


@pytest.fixture
def spec() -> Iterator[MpsDaemonSpec]:
    root = short_temp_dir()
    made = MpsDaemonSpec("GPU-1", root / "pipe", root / "log", thread_percentage=25, pinned_memory_mib=512)
    yield made
    pid = read_pid(made.pipe_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    remove_tree(root)


def test_mps_simulated_daemon_answers_the_documented_commands(spec: MpsDaemonSpec) -> None:
    daemons = ProcessMpsDaemons(simulated_command())
    daemons.start(spec)
    assert (spec.pipe_dir / mps_control.SOCKET_NAME).exists() and read_pid(spec.pipe_dir) is not None
    assert daemons.query(spec) == ()
    assert daemons.control(spec, "get_default_active_thread_percentage") == "25.0"
    assert daemons.control(spec, "get_default_device_pinned_mem_limit 0") == "512M"
    assert daemons.control(spec, "start_server -uid 1000") == ""
    assert len(daemons.query(spec)) == 1
    assert daemons.control(spec, "frobnicate").startswith("Unrecognized command")
    pid = read_pid(spec.pipe_dir)
    daemons.start(spec)  # a daemon already answering (left by a crashed agent) is kept
    assert read_pid(spec.pipe_dir) == pid and len(daemons.query(spec)) == 1
    done = subprocess.run(  # a second -d on a served pipe directory refuses to serve it
        [*simulated_command(), "-d"],
        env={**os.environ, mps_control.PIPE_ENV: str(spec.pipe_dir), mps_control.LOG_ENV: str(spec.log_dir)},
        check=True,
    )
    assert done.returncode == 0
    log = (spec.log_dir / mps_control.CONTROL_LOG).read_text()
    assert poll_until(
        lambda: "already running" in (spec.log_dir / mps_control.CONTROL_LOG).read_text(), timeout=10
    )
    assert "Command: get_server_list" in log
    daemons.stop(spec)
    assert read_pid(spec.pipe_dir) is None
    with pytest.raises(MpsControlError, match="Cannot find MPS control daemon"):
        daemons.query(spec)


def test_mps_killed_daemon_leaves_stale_files_and_a_new_one_takes_them_over(spec: MpsDaemonSpec) -> None:
    daemons = ProcessMpsDaemons(simulated_command())
    daemons.start(spec)
    first = read_pid(spec.pipe_dir)
    assert "killed" in daemons.kill(spec)
    with pytest.raises(MpsControlError):
        daemons.query(spec)
    daemons.start(spec)
    assert read_pid(spec.pipe_dir) not in (None, first)
    assert daemons.query(spec) == ()


def test_mps_missing_control_program_is_one_error_naming_the_gpu(spec: MpsDaemonSpec) -> None:
    with pytest.raises(MpsControlError, match="GPU-1"):
        ProcessMpsDaemons(["/nonexistent/nvidia-cuda-mps-control"]).start(spec)


def test_mps_sharing_config_reads_per_gpu_mps_defaults(tmp_path: Path) -> None:
    path = tmp_path / "sharing.yaml"
    path.write_text(
        "mpsPipeDirectory: /run/mps\n"
        "gpus:\n  '0': {mode: fractional,\n"
        "         mps: {defaultActiveThreadPercentage: 30, defaultPinnedMemoryMiB: 1024}}\n"
    )
    plan = load_sharing_plan(path)
    assert plan.mps_pipe_directory == "/run/mps"
    entry = plan.per_gpu["0"]
    assert entry.mode is SharingMode.FRACTIONAL
    assert (entry.mps.thread_percentage, entry.mps.pinned_memory_mib) == (30, 1024)
    path.write_text("gpus:\n  '0': {mode: fractional, mps: {defaultActiveThreadPercentage: 150}}\n")
    with pytest.raises(InvalidInputError, match="defaultActiveThreadPercentage"):
        load_sharing_plan(path)


def test_mps_daemonset_mounts_the_mps_base_directory_at_its_host_path() -> None:
    manifest = Path(__file__).resolve().parents[2] / "manifests" / "node-agent-daemonset.yaml"
    pod = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert mounts["mps"] == volumes["mps"] == HOST_BASE_DIR
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")  # the MPS programs come with it


def test_mps_kill_never_signals_another_process_named_by_a_stale_pid_file(spec: MpsDaemonSpec) -> None:
    spec.pipe_dir.mkdir(parents=True)
    (spec.pipe_dir / mps_control.PID_FILE).write_text(f"{os.getpid()}\n")  # this test, not a daemon
    assert "stale pid file" in ProcessMpsDaemons(simulated_command()).kill(spec)
    (spec.pipe_dir / mps_control.PID_FILE).unlink()


def test_mps_sim_inject_kill_needs_a_gpu_and_an_agent_with_daemons() -> None:
    with pytest.raises(InvalidInputError, match="--kill-mps-daemon need --gpu"):
        parse_request({"kill_mps_daemon": True})
    request = parse_request({"gpu": 0, "kill_mps_daemon": True})
    state = SimulatedNode(small_inventory()).health
    with pytest.raises(InvalidInputError, match="supervises no MPS daemons"):
        apply_request(state, request)
    assert apply_request(state, request, kill_mps=lambda gpu: f"GPU {gpu}: killed") == {
        "done": ["GPU 0: killed"]
    }


def test_mps_a_tenants_quit_and_planted_directory_cost_one_restart_not_a_fault(spec: MpsDaemonSpec) -> None:
    """A share tenant has the pipe directory mounted: it tells the daemon to quit, puts a directory
    where the control socket goes and a pid file naming process 1. The next supervision pass
    restarts the daemon in a cleaned directory, with no failed start (three make a GPU fault and a
    reset, evicting every tenant), and kills nothing but an MPS control program."""
    gated: list[dict[str, str]] = []
    supervisor = MpsSupervisor(
        ProcessMpsDaemons(simulated_command()),
        MpsSettings(base_dir=spec.pipe_dir.parent),
        gate=lambda down: gated.append(dict(down)),
    )
    wanted = {spec.gpu_uuid: spec}
    supervisor.check(wanted)
    assert supervisor.records()[spec.gpu_uuid].up
    env = {**os.environ, mps_control.PIPE_ENV: str(spec.pipe_dir), mps_control.LOG_ENV: str(spec.log_dir)}
    subprocess.run([*simulated_command()], input="quit\n", text=True, env=env, check=True)
    socket_path = spec.pipe_dir / mps_control.SOCKET_NAME
    assert poll_until(lambda: not socket_path.exists(), timeout=10)
    (socket_path / "planted").mkdir(parents=True)
    (spec.pipe_dir / mps_control.PID_FILE).write_text("1\n")
    assert supervisor.check(wanted) == []  # nothing to hand to health as a fault
    record = supervisor.records()[spec.gpu_uuid]
    assert record.up and record.restarts == 1 and record.failures == 0, record
    assert socket_path.is_socket()
    assert os.path.exists("/proc/1")
    assert gated[-1] == {}  # its shares are served again
