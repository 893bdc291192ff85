"""Active checks for the node agent: which exerciser, what counts as busy, the control commands.

- **Exerciser.** A simulated node is exercised by ``SimulatedExerciser`` over its own faults; a GPU
  host by DCGM's diagnostic where ``dcgmi`` is on PATH and its host engine answers (``backend:
  auto`` or ``dcgm``), else by the CUDA driver in a child process (``backend: cuda``, or ``auto``
  without DCGM), loading ``libcuda.so.1`` from ``driver_root``.
- **Busy.** A GPU a pod holds is never exercised: the kubelet's pod-resources API (when the agent
  has its socket) and the agent's own Allocate grants of the last seconds name the devices pods
  hold; a share or MIG device names its GPU. Health adds the GPU's compute processes.
- **Hold.** The GPUs under a check are withheld through the agent's ``active-check`` gate, so
  the kubelet places nothing on them until the run ends.
- **Control.** ``health.check`` starts a run (``{"gpus": [INDEX...] | null, "level": 1-4 | null}``)
  and answers its outcome so far; ``health.check.run`` (``{"run": N}``) answers a run's outcome.
  ``gpuweave check`` is the client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.validation import first_problem
from hardware.backend import GpuBackend
from hardware.exerciser.dcgm import DcgmExerciser
from hardware.exerciser.process import ProcessExerciser
from hardware.exerciser.protocol import Exerciser
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.exerciser import SimulatedExerciser
from health.active_runner import ActiveCheckRunner, Busy, Hold
from health.config import ActiveSettings
from nodeagent.agent import NodeAgent

log = logging.getLogger(__name__)
GATE = "active-check"
CHECK_METHOD, RUN_METHOD = "health.check", "health.check.run"
HeldByPods = Callable[[], Collection[str]]  # device IDs pods hold now (raises when it cannot tell)


def exerciser_for(backend: GpuBackend, settings: ActiveSettings) -> Exerciser:
    """The exerciser of this node's hardware, per ``settings.backend`` (see the module's docstring)."""
    if isinstance(backend, SimulatedBackend):
        node = backend.node
        return SimulatedExerciser(node.inventory, node.health, node.exerciser)
    if settings.backend in ("auto", "dcgm"):
        dcgm = DcgmExerciser.find()
        if dcgm is not None:
            log.warning("active checks run DCGM's diagnostic (dcgmi diag)")
            return dcgm
        if settings.backend == "dcgm":
            raise GpuweaveError(
                "health.active_checks.backend is dcgm, but dcgmi is not on PATH or its host engine does "
                "not answer `dcgmi discovery -l`; start nv-hostengine or set backend: cuda"
            )
    return ProcessExerciser(driver_root=Path(settings.driver_root))


def hold_for(agent: NodeAgent) -> Hold:
    return lambda reasons: agent.set_gate(GATE, reasons)


def busy_for(held_by_pods: HeldByPods) -> Busy:
    """A GPU is busy while any device ID pods hold is the GPU itself (shares name their GPU)."""

    def busy(uuid: str) -> str | None:
        return "a pod holds it" if uuid in held_by_pods() else None

    return busy


class CheckRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpus: list[int] | None = Field(None, max_length=1024)
    level: int | None = Field(None, ge=1, le=4)


class RunRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    run: int = Field(ge=1)


def _parse(model: type[BaseModel], params: dict[str, Any], method: str) -> Any:
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="request")
        raise InvalidInputError(f"bad {method} request at {where}: {problem}") from exc


def register_check_routes(agent: NodeAgent, runner: ActiveCheckRunner) -> None:
    def check(params: dict[str, Any]) -> dict[str, Any]:
        request: CheckRequest = _parse(CheckRequest, params, CHECK_METHOD)
        gpus = None if request.gpus is None else sorted(set(request.gpus))
        return runner.start(gpus, level=request.level, trigger="on-demand").to_json()

    def run(params: dict[str, Any]) -> dict[str, Any]:
        request: RunRequest = _parse(RunRequest, params, RUN_METHOD)
        outcome = runner.runs.get(request.run)
        if outcome is None:
            raise InvalidInputError(f"no active-check run {request.run} (the agent keeps the last 16)")
        return outcome.to_json()

    agent.control.add_route(CHECK_METHOD, check)
    agent.control.add_route(RUN_METHOD, run)
