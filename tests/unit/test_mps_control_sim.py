"""The simulated nvidia-cuda-mps-control as a program: -d, the control client, files (pytest -k mps)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import SharingMode, load_sharing_plan
from hardware.mps import MpsControlError, MpsDaemonQuitError, MpsDaemonSpec, is_mps_control, simulated_command
from hardware.mps_ledger import LEDGER_FILE
from hardware.mps_process import ProcessMpsDaemons
from hardware.simulated import mps_control
from hardware.simulated.health_inject import apply_request, parse_request
from hardware.simulated.node import SimulatedNode
from nodeagent.mps import HOST_BASE_DIR, MpsSettings, MpsSupervisor
from tests.support.agent_process import remove_tree, short_temp_dir
from tests.support.mps_node import read_pid
from tests.support.small_inventory import small_inventory
from tests.support.waiting import poll_until


@pytest.fixture
def spec() -> Iterator[MpsDaemonSpec]:
    root = short_temp_dir()
    made = MpsDaemonSpec("GPU-1", root / "pipe", root / "log", thread_percentage=25, pinned_memory_mib=512)
    yield made
    pid = read_pid(made.pipe_dir)
    if pid is not None and is_mps_control(pid):
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
    daemons.start(spec)  # the agent's own daemon that answers is kept
    assert read_pid(spec.pipe_dir) == pid == daemons.pid(spec) and len(daemons.query(spec)) == 1
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


def test_mps_kill_without_a_daemon_of_the_agents_signals_nothing(spec: MpsDaemonSpec) -> None:
    spec.pipe_dir.mkdir(parents=True)
    (spec.pipe_dir / mps_control.PID_FILE).write_text(f"{os.getpid()}\n")  # this test, not a daemon
    assert "no MPS daemon of the agent's" in ProcessMpsDaemons(simulated_command()).kill(spec)


def test_mps_sim_inject_kill_needs_a_gpu_and_an_agent_with_daemons() -> None:
    with pytest.raises(InvalidInputError, match=r"--kill-mps-daemon, .*need --gpu"):
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
        MpsSettings(base_dir=spec.pipe_dir.parent, restart_spacing_s=0.0),
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


def _tenant_env(spec: MpsDaemonSpec) -> dict[str, str]:
    """The environment of a share tenant's process: the GPU's pipe directory, as Allocate grants it."""
    return {**os.environ, mps_control.PIPE_ENV: str(spec.pipe_dir), mps_control.LOG_ENV: str(spec.log_dir)}


def _tenant_quit(spec: MpsDaemonSpec) -> None:
    env = _tenant_env(spec)
    subprocess.run(simulated_command(), input="quit\n", text=True, env=env, check=True, timeout=30)
    assert poll_until(lambda: read_pid(spec.pipe_dir) is None, timeout=10)  # it exited


def _tenant_daemon(spec: MpsDaemonSpec) -> int:
    """A tenant's own control daemon on the GPU's pipe directory (the socket there unlinked first)."""
    (spec.pipe_dir / mps_control.SOCKET_NAME).unlink(missing_ok=True)
    subprocess.run([*simulated_command(), "-d"], env=_tenant_env(spec), check=True, timeout=30)
    assert poll_until(lambda: read_pid(spec.pipe_dir) is not None, timeout=10)
    pid = read_pid(spec.pipe_dir)
    assert pid is not None
    return pid


@pytest.fixture
def other(spec: MpsDaemonSpec) -> Iterator[MpsDaemonSpec]:
    """A second GPU's daemon beside ``spec``'s."""
    root = spec.pipe_dir.parent / "other"
    made = MpsDaemonSpec("GPU-2", root / "pipe", root / "log")
    yield made
    pid = read_pid(made.pipe_dir)
    if pid is not None and is_mps_control(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_mps_a_pid_file_naming_another_gpus_daemon_never_gets_it_signalled(
    spec: MpsDaemonSpec, other: MpsDaemonSpec
) -> None:
    """A tenant of GPU-1 stops its daemon and writes GPU-2's daemon pid into GPU-1's pid file: the
    restart of GPU-1's daemon and a kill of it reach GPU-1's own processes only."""
    daemons = ProcessMpsDaemons(simulated_command())
    daemons.start(spec)
    daemons.start(other)
    victim = daemons.pid(other)
    assert victim is not None and victim == read_pid(other.pipe_dir)
    _tenant_quit(spec)
    (spec.pipe_dir / mps_control.PID_FILE).write_text(f"{victim}\n")
    daemons.start(spec)  # the restart
    assert daemons.pid(spec) not in (None, victim)
    (spec.pipe_dir / mps_control.PID_FILE).write_text(f"{victim}\n")
    assert f"MPS daemon {daemons.pid(spec)} killed" in daemons.kill(spec)
    assert is_mps_control(victim) and daemons.query(other) == ()


def test_mps_a_daemon_the_agent_did_not_start_is_never_kept(spec: MpsDaemonSpec) -> None:
    """A tenant quits the agent's daemon and runs its own on the pipe directory: the agent's next
    start does not take it for its daemon, it starts its own in the cleaned directory."""
    daemons = ProcessMpsDaemons(simulated_command())
    daemons.start(spec)
    _tenant_quit(spec)
    impostor = _tenant_daemon(spec)
    try:
        daemons.start(spec)
        ours = daemons.pid(spec)
        assert ours not in (None, impostor) and read_pid(spec.pipe_dir) == ours
        assert daemons.control(spec, "get_default_active_thread_percentage") == "25.0"
    finally:
        os.kill(impostor, signal.SIGKILL)


def test_mps_a_control_socket_swapped_by_a_tenant_is_a_down_daemon_not_an_answer(spec: MpsDaemonSpec) -> None:
    """A tenant unlinks the daemon's ``control`` socket and serves its own there while the agent's
    daemon runs: the agent's query fails (no answer from the tenant's daemon counts), and the
    restart puts the agent's daemon back on a socket of its own."""
    daemons = ProcessMpsDaemons(simulated_command())
    daemons.start(spec)
    first = daemons.pid(spec)
    impostor = _tenant_daemon(spec)
    try:
        with pytest.raises(MpsControlError, match="not the one its MPS daemon made"):
            daemons.query(spec)
        daemons.start(spec)
        assert daemons.pid(spec) not in (None, first, impostor) and daemons.query(spec) == ()
        assert first is not None and not is_mps_control(first)  # the agent's first daemon ended
    finally:
        os.kill(impostor, signal.SIGKILL)


def test_mps_an_agent_after_a_restart_takes_back_only_the_daemons_its_ledger_names(
    spec: MpsDaemonSpec, other: MpsDaemonSpec
) -> None:
    """The ledger in the state directory lets the next agent keep its running daemon (same pid, no
    restart); an entry whose process is not that very daemon (another GPU's, or a pid now held by
    another process) is neither kept nor signalled."""
    ledger = spec.pipe_dir.parent / "state" / LEDGER_FILE
    first = ProcessMpsDaemons(simulated_command(), ledger=ledger)
    first.start(spec)
    first.start(other)
    kept, other_pid = first.pid(spec), first.pid(other)
    assert kept is not None and other_pid is not None
    after = ProcessMpsDaemons(simulated_command(), ledger=ledger)
    after.start(spec)
    assert after.pid(spec) == kept == read_pid(spec.pipe_dir)
    wrong = json.loads(ledger.read_text())
    wrong["daemons"][spec.gpu_uuid]["pid"] = other_pid  # GPU-2's daemon named for GPU-1
    wrong["daemons"][other.gpu_uuid]["pid"] = os.getpid()  # this test, with the daemon's start time
    ledger.write_text(json.dumps(wrong))
    third = ProcessMpsDaemons(simulated_command(), ledger=ledger)
    third.start(other)
    assert third.pid(other) not in (None, other_pid, os.getpid())
    assert is_mps_control(other_pid)  # not signalled
    third.start(spec)
    assert third.pid(spec) not in (None, kept, other_pid) and is_mps_control(kept)
    for pid in (kept, other_pid):
        os.kill(pid, signal.SIGKILL)


def _quits_at_setup(root: Path) -> Path:
    """The simulated control program behind a wrapper that, when the agent sends the daemon its
    first default limit, first has the daemon told to ``quit``: a tenant's quit landing mid-start."""
    program = f"{sys.executable} -I -S {mps_control.__file__}"
    wrapper = root / "mps-control-quits"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$#" -eq 0 ]; then\n'
        "  input=$(cat)\n"
        f'  case "$input" in set_default*) printf "quit\\n" | {program} >/dev/null 2>&1;; esac\n'
        f'  printf "%s\\n" "$input" | exec {program}\n'
        "fi\n"
        f'exec {program} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def test_mps_a_quit_during_the_start_is_an_exit_not_a_failed_start(spec: MpsDaemonSpec) -> None:
    """A tenant's quit can land while the agent starts the daemon (after its first answer, before
    its default limits are set): that start is cut short, not failed, so it neither withholds the
    GPU's shares nor counts toward the fault that would reset the GPU and evict its tenants."""
    daemons = ProcessMpsDaemons([str(_quits_at_setup(spec.pipe_dir.parent))])
    with pytest.raises(MpsDaemonQuitError, match="told to quit while it started"):
        daemons.start(spec)
    gated: list[dict[str, str]] = []
    settings = MpsSettings(base_dir=spec.pipe_dir.parent, restart_spacing_s=0.0)
    supervisor = MpsSupervisor(daemons, settings, gate=lambda down: gated.append(dict(down)))
    for _ in range(4):  # past failures_to_fault, were these failed starts
        assert supervisor.check({spec.gpu_uuid: spec}) == []
    record = supervisor.records()[spec.gpu_uuid]
    assert record.restarting and not record.withheld and record.failures == 0, record
    assert all(down == {} for down in gated)


def test_mps_a_start_that_fails_after_a_tenants_quit_is_still_a_failed_start(spec: MpsDaemonSpec) -> None:
    """Only the daemon being started counts: the one a tenant quit before (status 0) does not
    turn a start that fails on its own (here the program is gone) into a quit."""
    daemons = ProcessMpsDaemons(simulated_command())
    daemons.start(spec)
    _tenant_quit(spec)
    daemons.command = ["/nonexistent/nvidia-cuda-mps-control"]
    with pytest.raises(MpsControlError, match="nonexistent") as failed:
        daemons.start(spec)
    assert not isinstance(failed.value, MpsDaemonQuitError)
