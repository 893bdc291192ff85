"""MPS for the node agent: one supervised control daemon per fractional GPU, wired to health.

Called through ``gpuweave.node.builder.NodeAgentBuilder.mps`` (the process's daemons, from
``process_daemons``, or the simulated cluster's in-memory ones). ``start_node_mps`` starts the
daemons *before* the agent serves (a fractional GPU whose daemon cannot start is under the ``mps``
gate from the first device list), starts the supervisor's restarter thread (a daemon that exits
is restarted at once), installs the per-GPU pipe lookup for Allocate and adds the control commands
``mps.status`` and ``sharing.reload``. ``MpsSignal`` then runs the supervisor in every health
round; a GPU whose daemon cannot be restarted becomes a fault of that GPU in the health engine
(Event, metric, graded remediation of the pods on it).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan, load_sharing_plan
from hardware.mps import DEFAULT_BINARY, MpsDaemons, MpsDaemonSpec, simulated_command
from hardware.mps_ledger import LEDGER_FILE
from hardware.mps_process import ProcessMpsDaemons
from health.policy import DeviceState, Fault
from health.signals.protocol import Observations, RoundContext
from health.xid import Action, Cause, Severity
from nodeagent.agent import NodeAgent
from nodeagent.mps import (
    GATE,
    HOST_BASE_DIR,
    MpsSettings,
    MpsSupervisor,
    check_pipe_paths,
    status,
    wanted_daemons,
)

log = logging.getLogger(__name__)
MPS_SIGNAL = "mps-daemon"


def mps_base_dir(plan: SharingPlan, *, state_dir: Path, simulated: bool) -> Path:
    """Where each GPU's ``<uuid>/pipe`` and ``<uuid>/log`` live: ``mpsPipeDirectory`` when set,
    else ``/run/gpuweave/mps`` on a host and ``STATE_DIR/mps`` in simulation."""
    if plan.mps_pipe_directory:
        return Path(plan.mps_pipe_directory)
    return state_dir / "mps" if simulated else Path(HOST_BASE_DIR)


def control_command(binary: str | None, *, simulated: bool) -> list[str]:
    """The control program: ``--mps-control``, else the simulated one or the driver's binary."""
    if binary:
        return [binary]
    return simulated_command() if simulated else [DEFAULT_BINARY]


def process_daemons(binary: str | None, *, state_dir: Path, simulated: bool) -> ProcessMpsDaemons:
    """The node agent's daemons, run as its own processes and recorded in ``STATE_DIR/mps-daemons.json``
    (the agent's state directory, which no share tenant has mounted), so that the agent after a
    restart takes back its own daemons and never a process named by a tenant-writable file."""
    return ProcessMpsDaemons(control_command(binary, simulated=simulated), ledger=state_dir / LEDGER_FILE)


def require_binary(command: Sequence[str], wanted: Collection[str]) -> None:
    """One line at start when fractional GPUs are configured but the control program is missing."""
    if wanted and shutil.which(command[0]) is None:
        raise GpuweaveError(
            f"{len(wanted)} GPU(s) are fractional but the MPS control program {command[0]!r} is not "
            "found: install the driver's nvidia-cuda-mps-control on the node (the container "
            "needs NVIDIA_DRIVER_CAPABILITIES=compute,utility) or give --mps-control PATH"
        )


@dataclass
class NodeMps:
    """The supervisor with what it needs to know which daemons the node wants now."""

    agent: NodeAgent
    supervisor: MpsSupervisor

    def wanted(self, retired: Collection[str] = ()) -> dict[str, MpsDaemonSpec]:
        return self.wanted_for(self.agent.inventory, retired=retired)

    def wanted_for(
        self, inventory: NodeInventory, *, retired: Collection[str] = ()
    ) -> dict[str, MpsDaemonSpec]:
        plan = self.agent.config.sharing
        return wanted_daemons(inventory, plan, base_dir=self.supervisor.settings.base_dir, retired=retired)

    def kill(self, gpu_index: int) -> str:
        """``sim inject --kill-mps-daemon``: kill GPU ``gpu_index``'s daemon as a crash would."""
        for gpu in self.agent.inventory.gpus:
            if gpu.index == gpu_index:
                return self.supervisor.kill(gpu.uuid)
        raise GpuweaveError(f"no GPU {gpu_index} on this node ({len(self.agent.inventory.gpus)} GPUs)")

    def stop(self) -> None:
        self.supervisor.stop_all()


def start_node_mps(
    agent: NodeAgent,
    *,
    daemons: MpsDaemons,
    inventory: NodeInventory,
    settings: MpsSettings,
    sharing_config: Path | None = None,
) -> NodeMps:
    """Start every wanted daemon (before ``agent.start``), install the Allocate lookup and routes."""
    supervisor = MpsSupervisor(daemons, settings, gate=lambda reasons: agent.set_gate(GATE, reasons))
    mps = NodeMps(agent, supervisor)
    wanted = mps.wanted_for(inventory)
    check_pipe_paths(wanted)
    if isinstance(daemons, ProcessMpsDaemons):
        require_binary(daemons.command, wanted)
    supervisor.check(wanted)
    supervisor.start_restarter()  # a daemon that exits is restarted at once, not at the next round
    if wanted:
        up = sum(1 for r in supervisor.records().values() if r.up)
        log.info(
            "MPS: %d of %d fractional GPUs have a live daemon under %s", up, len(wanted), settings.base_dir
        )
    agent.use_mps_pipes(supervisor.pipe_directory)
    agent.control.add_route("mps.status", lambda _params: {"gpus": status(supervisor)})
    if sharing_config is not None:
        agent.control.add_route("sharing.reload", lambda _params: _reload(agent, mps, sharing_config))
    return mps


def _reload(agent: NodeAgent, mps: NodeMps, path: Path) -> dict[str, Any]:
    """Re-read the sharing file: re-offer the GPUs, then start and stop daemons to match at once."""
    plan = load_sharing_plan(path)
    check_pipe_paths(wanted_daemons(agent.inventory, plan, base_dir=mps.supervisor.settings.base_dir))
    counts = agent.set_sharing(plan)
    mps.supervisor.check(mps.wanted())
    return {"resources": counts, "mps": status(mps.supervisor)}


class MpsSignal:
    """A health signal (``health.signals.protocol.HealthSignal``): each round, supervise the
    daemons; a GPU whose daemon cannot be restarted gets a fatal fault."""

    name = MPS_SIGNAL

    def __init__(self, mps: NodeMps) -> None:
        self._mps = mps

    def observe(self, context: RoundContext) -> Observations:
        retired = {uuid for uuid, state in context.gpu_states().items() if state is DeviceState.RETIRED}
        to_fault = self._mps.supervisor.check(self._mps.wanted(retired), in_round=True)
        faults = [
            (
                record.spec.gpu_uuid,
                Fault(
                    context.clock(),
                    MPS_SIGNAL,
                    Severity.FATAL,
                    f"MPS control daemon cannot be restarted: {record.reason}",
                    cause=Cause.DRIVER,
                    ladder=(Action.RESET_GPU,),
                    strike=False,
                ),
            )
            for record in to_fault
        ]
        return Observations(faults=faults)
