"""One MPS control daemon per fractional GPU, with the real node-agent process and the kubelet emulator.

GPUs 0 and 1 of a four-GPU node are fractional; their daemons are the simulated
``nvidia-cuda-mps-control`` run as processes (the same program path a GPU host runs), behind a
wrapper that refuses to start a daemon while a block file exists, so a test can keep one down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from devicemodel.spec import NodeProfile
from hardware.mps import is_mps_control, simulated_command
from hardware.mps_ledger import LEDGER_FILE
from hardware.simulated import mps_control
from mig.journal import JOURNAL_FILE
from nodeagent.control import call_agent
from tests.support.agent_node import run_sim_inject
from tests.support.agent_process import REPO_ROOT, AgentProcess, remove_tree, short_temp_dir
from tests.support.device_watch import Watch
from tests.support.mps_node import MpsNode, read_pid, shares_healthy, sharing_yaml
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.support.waiting import poll_until

ROUND_S = 0.3
HEALTHY = "Healthy"


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Iterator[MpsNode]:
    # a test may keep a faulted GPU in probation longer (``indirect`` parameter), so that its
    # fault is still to be seen however long the steps before the look took
    started = MpsNode(round_s=ROUND_S, probation_rounds=getattr(request, "param", 2))
    try:
        assert started.kubelet.wait_for(
            lambda: (
                len(started.kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 200
                and bool(started.kubelet.healthy(RESOURCE_GPU_MEMORY))
            ),
            timeout=30,
        ), started.kubelet.devices(RESOURCE_GPU_COMPUTE)
        yield started
    finally:
        started.kill_leftover_daemons()
        started.close()


def _tenant_quit(pipe: Path) -> None:
    """What a share tenant of that GPU can do: tell the daemon on its mounted pipe directory to quit."""
    env = {**os.environ, mps_control.PIPE_ENV: str(pipe)}
    subprocess.run(simulated_command(), input="quit\n", text=True, env=env, check=True, timeout=30)


def test_mps_two_fractional_gpus_run_two_daemons_and_allocate_gives_each_its_own_pipe(node: MpsNode) -> None:
    status = node.mps_status()
    assert sorted(status) == [gpu_uuid(0), gpu_uuid(1)]
    pids = {read_pid(node.pipe_dir(i)) for i in (0, 1)}
    assert None not in pids and len(pids) == 2
    for index in (0, 1):
        pipe = str(node.pipe_dir(index))
        compute = node.allocate(node.share_ids(index, count=30))
        assert compute.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert compute.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert compute.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(index)
        assert [(m.container_path, m.host_path) for m in compute.mounts] == [(pipe, pipe)]
        assert (node.pipe_dir(index) / mps_control.SOCKET_NAME).exists()
        memory = node.allocate(
            node.share_ids(index, count=4, resource=RESOURCE_GPU_MEMORY), RESOURCE_GPU_MEMORY
        )
        assert memory.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"
        assert memory.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        log = (node.pipe_dir(index).parent / "log" / mps_control.CONTROL_LOG).read_text()
        assert f"set_default_active_thread_percentage {50 + index}" in log


def test_mps_killed_daemon_is_restarted_at_once_and_no_share_is_withheld(node: MpsNode) -> None:
    """SIGKILL of GPU 0's daemon: the agent sees its own process end and restarts it, without
    waiting for a health round; the kubelet's stream never lists a share of either GPU withheld."""
    watch = Watch(node, RESOURCE_GPU_COMPUTE)
    try:
        assert watch.wait(shares_healthy(0)) >= 0
        first = len(watch.lists)
        old_pid = node.mps_status()[gpu_uuid(0)]["pid"]
        assert old_pid == read_pid(node.pipe_dir(0))
        done = run_sim_inject(node.state_dir, "--gpu", "0", "--kill-mps-daemon")
        assert done.returncode == 0, done.stderr
        assert f"MPS daemon {old_pid} killed" in done.stdout
        assert node.kubelet.wait_for(lambda: node.mps_status()[gpu_uuid(0)]["restarts"] == 1, timeout=30)
        status = node.mps_status()[gpu_uuid(0)]
        assert status["up"] and status["pid"] not in (None, old_pid)
        assert status["pid"] == read_pid(node.pipe_dir(0))
        assert all(shares_healthy(0)(d) and shares_healthy(1)(d) for d in watch.lists[first:])
        ledger = json.loads((node.state_dir / LEDGER_FILE).read_text())["daemons"]
        assert ledger[gpu_uuid(0)]["pid"] == status["pid"]
    finally:
        watch.close()


def test_mps_a_tenants_quit_and_planted_control_directory_cost_a_restart_each_no_reset(node: MpsNode) -> None:
    """What a share tenant can do through its mounted pipe directory: quit the daemon, and put a
    directory where its control socket was while it runs. Each costs one restart of GPU 0's
    daemon, no share is withheld, no GPU faults (so no reset-gpu evicts anyone), GPU 1 is untouched."""
    watch = Watch(node, RESOURCE_GPU_COMPUTE)
    try:
        assert watch.wait(shares_healthy(0)) >= 0
        first = len(watch.lists)
        pipe = node.pipe_dir(0)
        _tenant_quit(pipe)
        assert node.kubelet.wait_for(lambda: node.mps_status()[gpu_uuid(0)]["restarts"] == 1, timeout=30)
        (pipe / mps_control.SOCKET_NAME).unlink()
        (pipe / mps_control.SOCKET_NAME / "planted").mkdir(parents=True)
        assert node.kubelet.wait_for(lambda: node.mps_status()[gpu_uuid(0)]["restarts"] == 2, timeout=30)
        assert (pipe / mps_control.SOCKET_NAME).is_socket()
        assert all(shares_healthy(0)(d) and shares_healthy(1)(d) for d in watch.lists[first:])
        assert node.mps_status()[gpu_uuid(1)]["restarts"] == 0
        gpus = call_agent(node.state_dir, "health.status", {})["gpus"]
        assert all(row["state"] == HEALTHY for row in gpus.values()), gpus
    finally:
        watch.close()


@pytest.mark.parametrize("node", [1000], indirect=True)  # the MPS fault stays in probation
def test_mps_share_is_never_granted_while_its_daemon_is_down(node: MpsNode) -> None:
    node.block.touch()
    assert run_sim_inject(node.state_dir, "--gpu", "0", "--kill-mps-daemon").returncode == 0
    with pytest.raises(grpc.RpcError) as refused:  # before any round noticed: Allocate queries it
        node.allocate(node.share_ids(0, count=10))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "MPS" in str(refused.value.details())
    assert node.kubelet.wait_for(
        lambda: not node.kubelet.healthy(RESOURCE_GPU_COMPUTE) & set(node.share_ids(0, count=100))
    )
    assert node.allocate(node.share_ids(1, count=10)).envs["CUDA_MPS_PIPE_DIRECTORY"] == str(node.pipe_dir(1))

    def faulted() -> bool:
        gpus = call_agent(node.state_dir, "health.status", {})["gpus"]
        return gpus[gpu_uuid(0)]["state"] != HEALTHY and "MPS" in gpus[gpu_uuid(0)]["reason"]

    assert node.kubelet.wait_for(faulted, timeout=60)  # three failed starts: a fault of GPU 0 in health
    gpus = call_agent(node.state_dir, "health.status", {})["gpus"]
    assert {uuid for uuid, row in gpus.items() if row["state"] != HEALTHY} == {gpu_uuid(0)}
    with pytest.raises(grpc.RpcError):
        node.allocate(node.share_ids(0, count=10))
    node.block.unlink()
    assert node.kubelet.wait_for(lambda: bool(node.mps_status()[gpu_uuid(0)]["up"]), timeout=30)


def test_mps_switching_a_gpu_to_exclusive_stops_its_daemon(node: MpsNode) -> None:
    pipe = node.pipe_dir(1)
    assert read_pid(pipe) is not None
    node.sharing.write_text(sharing_yaml((0,)))
    call_agent(node.state_dir, "sharing.reload", {})
    assert sorted(node.mps_status()) == [gpu_uuid(0)]
    assert read_pid(pipe) is None and not (pipe / mps_control.SOCKET_NAME).exists()
    assert node.kubelet.wait_for(lambda: f"{gpu_uuid(1)}" in "".join(node.kubelet.healthy(RESOURCE_GPU)))
    assert node.kubelet.wait_for(lambda: len(node.kubelet.devices(RESOURCE_GPU_COMPUTE)) == 100)
    assert read_pid(node.pipe_dir(0)) is not None


def test_mps_daemon_of_a_retired_gpu_is_stopped_at_the_first_health_round() -> None:
    node = MpsNode(round_s=ROUND_S, retired=(1,))
    try:
        assert node.kubelet.wait_for(lambda: len(node.kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 100, 30)
        assert node.kubelet.wait_for(lambda: sorted(node.mps_status()) == [gpu_uuid(0)])
        assert read_pid(node.pipe_dir(1)) is None  # started before health read the list, then quit
        log = (node.pipe_dir(1).parent / "log" / mps_control.CONTROL_LOG).read_text()
        assert "Command: quit" in log and log.rstrip().endswith("Exit")
        assert read_pid(node.pipe_dir(0)) is not None
    finally:
        node.kill_leftover_daemons()
        node.close()


def test_mps_daemon_stops_when_its_gpu_is_reshaped_to_mig(node: MpsNode) -> None:
    command = [sys.executable, "-m", "gpuweave", "mig", "apply", "--state-dir", str(node.state_dir)]
    done = subprocess.run(
        [*command, "--gpu", "1", "--profiles", "3g.40gb,3g.40gb"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert node.kubelet.wait_for(lambda: sorted(node.mps_status()) == [gpu_uuid(0)], timeout=30)
    assert read_pid(node.pipe_dir(1)) is None and read_pid(node.pipe_dir(0)) is not None
    assert node.kubelet.wait_for(lambda: len(node.kubelet.healthy("nvidia.com/mig-3g.40gb")) == 2)
    assert node.kubelet.wait_for(lambda: len(node.kubelet.devices(RESOURCE_GPU_COMPUTE)) == 100)


def test_mps_a_start_refused_by_a_state_file_leaves_no_daemon_running() -> None:
    """The MPS daemons start before the device lists, and the MIG journal, the bad-hardware list
    and the DRA checkpoint are read after them: a start refused there stops them again."""
    root = short_temp_dir()
    try:
        (root / "k").mkdir()
        state = root / "s"
        state.mkdir()
        (state / JOURNAL_FILE).write_text("{not json")  # the MIG journal: read after MPS started
        profile = root / "node.yaml"
        profile.write_text(yaml.safe_dump(NodeProfile.from_inventory(small_inventory()).to_wire()))
        sharing = root / "sharing.yaml"
        sharing.write_text(sharing_yaml((0, 1)))
        extra = ("--sharing-config", str(sharing))
        agent = AgentProcess(root / "k", state, profile=str(profile), extra=extra)
        _, err = agent.process.communicate(timeout=120)
        stderr = err.decode()
        assert agent.process.returncode != 0
        assert JOURNAL_FILE in stderr, stderr
        logs = [f.read_text() for f in (state / "mps").glob("*/log/" + mps_control.CONTROL_LOG)]
        assert len(logs) == 2 and all("Starting control daemon" in log for log in logs)  # both started
        assert all("Command: quit" in log for log in logs), logs  # ... and stopped with the refusal
        pid_files = (state / "mps").glob("*/pipe/" + mps_control.PID_FILE)
        assert [pid for f in pid_files if (pid := read_pid(f.parent)) and is_mps_control(pid)] == []
    finally:
        for pid_file in (root / "s" / "mps").glob("*/pipe/" + mps_control.PID_FILE):
            pid = read_pid(pid_file.parent)
            if pid is not None and is_mps_control(pid):
                os.kill(pid, signal.SIGKILL)
        remove_tree(root)


def test_mps_a_pid_file_naming_another_gpus_daemon_never_gets_that_daemon_killed(node: MpsNode) -> None:
    """A tenant of GPU 0 stops GPU 0's daemon and writes GPU 1's daemon pid into GPU 0's pid file.
    Neither the restart of GPU 0's daemon nor a kill of it (``--kill-mps-daemon``) signals GPU 1's."""
    victim = read_pid(node.pipe_dir(1))
    assert victim is not None
    pipe = node.pipe_dir(0)
    _tenant_quit(pipe)
    assert poll_until(lambda: read_pid(pipe) is None, timeout=10)  # the daemon exited
    (pipe / mps_control.PID_FILE).write_text(f"{victim}\n")
    assert node.kubelet.wait_for(lambda: node.mps_status()[gpu_uuid(0)]["restarts"] == 1, timeout=30)
    (pipe / mps_control.PID_FILE).write_text(f"{victim}\n")
    assert run_sim_inject(node.state_dir, "--gpu", "0", "--kill-mps-daemon").returncode == 0
    assert node.kubelet.wait_for(lambda: node.mps_status()[gpu_uuid(0)]["restarts"] == 2, timeout=30)
    assert is_mps_control(victim) and read_pid(node.pipe_dir(1)) == victim
    assert node.mps_status()[gpu_uuid(1)]["restarts"] == 0
    assert node.allocate(node.share_ids(1, count=10)).envs["CUDA_MPS_PIPE_DIRECTORY"] == str(node.pipe_dir(1))


def test_mps_a_tenant_quitting_the_daemon_again_and_again_costs_no_refused_or_withheld_share(
    node: MpsNode,
) -> None:
    """A tenant of GPU 0 quits its daemon four times, each time as soon as it is back, while a
    co-tenant asks for shares of GPU 0 all along: every Allocate is granted (it waits for the
    restart) and the kubelet's stream never lists GPU 0's shares withheld."""
    watch = Watch(node, RESOURCE_GPU_COMPUTE)
    granted, refused = [], []
    done = threading.Event()

    def co_tenant() -> None:
        while not done.is_set():
            try:
                granted.append(node.allocate(node.share_ids(0, count=10)).envs["CUDA_MPS_PIPE_DIRECTORY"])
            except grpc.RpcError as exc:
                refused.append(str(exc.details()))
            done.wait(0.1)  # a pod admission every 0.1 s (the agent logs each refusal)

    asking = threading.Thread(target=co_tenant, daemon=True)
    try:
        assert watch.wait(shares_healthy(0)) >= 0
        first = len(watch.lists)
        asking.start()
        for quits in range(1, 5):
            _tenant_quit(node.pipe_dir(0))
            assert node.kubelet.wait_for(
                lambda quits=quits: int(node.mps_status()[gpu_uuid(0)]["restarts"]) >= quits, timeout=30
            )
        done.set()
        asking.join(30)
        assert refused == [] and len(granted) > 0, refused
        assert set(granted) == {str(node.pipe_dir(0))}
        assert all(shares_healthy(0)(devices) for devices in watch.lists[first:]), watch.lists[first:]
    finally:
        done.set()
        watch.close()
