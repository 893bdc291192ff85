"""A node agent process whose GPUs 0 and 1 (of four) are fractional, each with its MPS daemon.

The daemons are the simulated ``nvidia-cuda-mps-control`` run as processes (the program path a GPU
host runs), behind a wrapper that refuses to start a daemon while ``block`` exists, so a test can
keep one down. The health round is short (``round_s``) so supervision acts quickly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
from pathlib import Path

import yaml

from devicemodel.contracts import RESOURCE_GPU_COMPUTE
from devicemodel.spec import NodeProfile
from hardware.mps import is_mps_control
from hardware.simulated import mps_control
from health.badlist import BAD_HARDWARE_FILE
from nodeagent.control import call_agent
from proto.v1beta1 import api_pb2
from tests.support.agent_node import AgentNode
from tests.support.agent_process import short_temp_dir
from tests.support.device_watch import Listed
from tests.support.small_inventory import gpu_uuid, small_inventory

HEALTHY = "Healthy"


def sharing_yaml(fractional: tuple[int, ...]) -> str:
    gpus = {
        str(i): {"mode": "fractional", "mps": {"defaultActiveThreadPercentage": 50 + i}} for i in fractional
    }
    return yaml.safe_dump({"kind": "SharingConfig", "gpus": gpus})


def read_pid(pipe_dir: Path) -> int | None:
    """The pid the simulated daemon wrote into its pipe directory (what a test looks at; the agent
    never reads it: share tenants can write there)."""
    try:
        return int((pipe_dir / mps_control.PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def blockable_control(root: Path) -> tuple[Path, Path]:
    """(program, block file): the simulated MPS control program behind a wrapper that refuses to
    start a daemon (``-f`` or ``-d`` exits 1) while the block file exists."""
    block = root / "block-mps-start"
    wrapper = root / "mps-control"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" != "" ] && [ -e {block} ]; then echo "start blocked by test" >&2; exit 1; fi\n'
        f'exec {sys.executable} -I -S {mps_control.__file__} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper, block


class MpsNode(AgentNode):
    def __init__(
        self, *, round_s: float = 0.3, retired: tuple[int, ...] = (), probation_rounds: int = 2
    ) -> None:
        """``retired``: GPUs on the node's bad-hardware list before the agent starts;
        ``probation_rounds``: clean health rounds before a faulted GPU is Healthy again."""
        root = short_temp_dir()
        (root / "s").mkdir()
        bad = {
            gpu_uuid(i): {"uuid": gpu_uuid(i), "reason": "test", "node": "node-a", "since": "", "strikes": 3}
            for i in retired
        }
        (root / "s" / BAD_HARDWARE_FILE).write_text(json.dumps(bad))
        profile = root / "node.yaml"
        profile.write_text(yaml.safe_dump(NodeProfile.from_inventory(small_inventory()).to_wire()))
        self.sharing = root / "sharing.yaml"
        self.sharing.write_text(sharing_yaml((0, 1)))
        health = root / "health.yaml"
        settings = {
            "round_interval_s": round_s,
            "startup_rounds": 1,
            "probation_rounds": probation_rounds,
            # the health loop's watchdog (3 rounds + 2 check timeouts) is not what these tests
            # look at: on a loaded machine 5 s of it marks every device Suspect
            "check_timeout_s": 10.0,
        }
        health.write_text(yaml.safe_dump({"health": settings}))
        wrapper, self.block = blockable_control(root)
        extra = ("--sharing-config", str(self.sharing), "--health-config", str(health))
        super().__init__(str(profile), extra=(*extra, "--mps-control", str(wrapper)), root=root)

    def pipe_dir(self, index: int) -> Path:
        return self.state_dir / "mps" / gpu_uuid(index) / "pipe"

    def mps_status(self) -> dict[str, dict[str, object]]:
        return dict(call_agent(self.state_dir, "mps.status", {})["gpus"])

    def share_ids(self, index: int, *, count: int, resource: str = RESOURCE_GPU_COMPUTE) -> list[str]:
        kind = "compute" if resource == RESOURCE_GPU_COMPUTE else "memory"
        return [f"{gpu_uuid(index)}::{kind}-{unit}" for unit in range(count)]

    def allocate(
        self, ids: list[str], resource: str = RESOURCE_GPU_COMPUTE
    ) -> api_pb2.ContainerAllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        return self.kubelet.stub(resource).Allocate(request, timeout=10).container_responses[0]

    def kill_leftover_daemons(self) -> None:
        for pid_file in (self.state_dir / "mps").glob("*/pipe/" + mps_control.PID_FILE):
            pid = read_pid(pid_file.parent)
            if pid is not None and is_mps_control(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def shares_healthy(gpu: int) -> Listed:
    """A device list in which GPU ``gpu`` has shares, all Healthy."""
    prefix = gpu_uuid(gpu)
    return lambda devices: (
        any(i.startswith(prefix) for i in devices)
        and all(h == HEALTHY for i, h in devices.items() if i.startswith(prefix))
    )


def shares_withheld(gpu: int) -> Listed:
    """A device list in which GPU ``gpu`` has shares, none Healthy."""
    prefix = gpu_uuid(gpu)
    return lambda devices: (
        any(i.startswith(prefix) for i in devices)
        and all(h != HEALTHY for i, h in devices.items() if i.startswith(prefix))
    )
