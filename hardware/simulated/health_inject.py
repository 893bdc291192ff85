"""The ``sim.inject`` control command: fault injection into a running simulated node.

Parameters arrive as JSON from ``gpuweave sim inject`` over the agent's control socket; they are
validated here (pydantic, the edge) and applied to the node's ``SimHealthState``, which raises
the NVML event and writes the kernel-log line as the driver would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from devicemodel.errors import InvalidInputError
from devicemodel.validation import first_problem
from hardware.simulated.exerciser import SimExerciserState
from hardware.simulated.health_calls import SimHealthError, SimHealthState
from hardware.simulated.mig_calls import SimMigNode


class InjectRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: int | None = Field(None, ge=0)
    xid: int | None = Field(None, ge=1)
    mig_instance: str | None = Field(None, pattern=r"^\d+(:\d+)?$")  # "GI" or "GI:CI"
    ecc_dbe: int | None = Field(None, ge=1)
    nvlink_down: int | None = Field(None, ge=0)
    efa_down: str | None = None
    efa_missing: str | None = None
    efa_stalled: str | None = None
    nvml_hang: float | None = Field(None, gt=0, le=3600)
    temperature: int | None = Field(None, ge=0, le=200)
    recovery_action: int | None = Field(None, ge=0, le=7)  # nvmlDeviceGpuRecoveryAction_t
    busy: list[int] | None = None  # pids using the GPU (a reset waits for them); [] frees it
    fabric_state: Literal["not-started", "in-progress", "completed", "failed"] | None = None
    kill_mps_daemon: bool = False  # SIGKILL the GPU's MPS control daemon, as a crash would
    bad_memory: int | None = Field(None, ge=0, lt=1 << 50)  # byte offset of a stuck memory cell
    slow_nvlink: int | None = Field(None, ge=0)  # the peer GPU of an NVLink pair at half its lanes
    pcie_width: int | None = Field(None, ge=1, le=32)  # the PCIe link trains at this width
    check_hang: float | None = Field(None, gt=0, le=3600)  # active checks hang this long
    reset_fails: bool = False  # the GPU's resets fail from now on (it does not come back)
    clear: bool = False

    @model_validator(mode="after")
    def _one_fault_needs_a_gpu(self) -> InjectRequest:
        gpu_faults = [
            self.xid,
            self.ecc_dbe,
            self.nvlink_down,
            self.temperature,
            self.busy,
            self.recovery_action,
            self.kill_mps_daemon or None,
            self.bad_memory,
            self.slow_nvlink,
            self.pcie_width,
            self.reset_fails or None,
        ]
        if any(v is not None for v in gpu_faults) and self.gpu is None:
            raise ValueError(
                "--xid, --ecc-dbe, --nvlink-down, --temperature, --busy, --recovery-action, "
                "--kill-mps-daemon, --bad-memory, --slow-nvlink, --pcie-width, --reset-fails need --gpu INDEX"
            )
        if self.mig_instance is not None and self.xid is None and self.busy is None:
            raise ValueError("--mig-instance only qualifies --xid and --busy")
        if not self.clear and all(
            v is None
            for v in [
                *gpu_faults,
                *(self.efa_down, self.efa_missing, self.efa_stalled, self.nvml_hang, self.fabric_state),
                self.check_hang,
            ]
        ):
            raise ValueError("nothing to inject: pass a fault option or --clear")
        return self


def parse_request(params: dict[str, Any]) -> InjectRequest:
    try:
        return InjectRequest.model_validate(params)
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="request")
        raise InvalidInputError(f"bad sim.inject request at {where}: {problem}") from exc


def apply_request(
    state: SimHealthState,
    request: InjectRequest,
    *,
    mig: SimMigNode | None = None,
    kill_mps: Callable[[int], str] | None = None,
    exerciser: SimExerciserState | None = None,
) -> dict[str, Any]:
    """Apply one request; returns what was done (for the CLI to print)."""
    done: list[str] = []
    gpu = request.gpu
    try:
        if request.clear:
            state.clear(gpu)
            if exerciser is not None:
                exerciser.clear(gpu)
            done.append("cleared " + ("every fault" if gpu is None else f"GPU {gpu}"))
        done.extend(_exerciser_faults(state, exerciser, request))
        if request.xid is not None and gpu is not None:
            gi, ci = _instance(request.mig_instance)
            line = state.inject_xid(gpu, request.xid, gpu_instance=gi, compute_instance=ci)
            done.append(f"kernel log: {line}")
        done.extend(_recovery_faults(state, request))
        if request.ecc_dbe is not None and gpu is not None:
            state.inject_ecc_dbe(gpu, request.ecc_dbe)
            done.append(f"GPU {gpu}: {request.ecc_dbe} volatile DBE")
        if request.nvlink_down is not None and gpu is not None:
            state.set_nvlink_down(gpu, request.nvlink_down)
            done.append(f"GPU {gpu}: NVLink {request.nvlink_down} down")
        if request.temperature is not None and gpu is not None:
            state.set_temperature(gpu, request.temperature)
            done.append(f"GPU {gpu}: {request.temperature} C")
        if request.busy is not None and gpu is not None and request.mig_instance is not None:
            done.append(_mig_busy(mig, gpu, request.mig_instance, busy=bool(request.busy)))
        elif request.busy is not None and gpu is not None:
            state.set_processes(gpu, tuple(request.busy))
            done.append(f"GPU {gpu}: processes {request.busy}")
        if request.efa_down is not None:
            state.set_efa(request.efa_down, link_up=False)
            done.append(f"EFA {request.efa_down}: link down")
        if request.efa_stalled is not None:
            state.stall_efa(request.efa_stalled)
            done.append(f"EFA {request.efa_stalled}: admin commands no longer complete")
        if request.efa_missing is not None:
            state.set_efa(request.efa_missing, present=False)
            done.append(f"EFA {request.efa_missing}: missing")
        if request.fabric_state is not None:
            state.set_fabric_state(request.fabric_state)
            done.append(f"NVSwitch fabric: {request.fabric_state}")
        if request.kill_mps_daemon and gpu is not None:
            done.append(_kill_mps(kill_mps, gpu))
        if request.nvml_hang is not None:
            state.hang(request.nvml_hang, gpu)
            done.append(f"NVML hangs {request.nvml_hang:g} s" + ("" if gpu is None else f" on GPU {gpu}"))
    except SimHealthError as exc:
        raise InvalidInputError(str(exc)) from exc
    return {"done": done}


def _recovery_faults(state: SimHealthState, request: InjectRequest) -> list[str]:
    """What the driver recommends (a recovery action) and whether a reset brings the GPU back."""
    gpu = request.gpu
    done: list[str] = []
    if gpu is None:
        return done
    if request.reset_fails:
        state.set_reset_fails(gpu)
        done.append(f"GPU {gpu}: resets fail from now on")
    if request.recovery_action is not None:
        done.append(f"kernel log: {state.set_recovery_action(gpu, request.recovery_action)}")
    return done


def inject_route(
    state: SimHealthState,
    *,
    mig: SimMigNode | None = None,
    kill_mps: Callable[[int], str] | None = None,
    exerciser: SimExerciserState | None = None,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The handler the agent registers as ``sim.inject``; ``kill_mps`` kills GPU N's MPS daemon;
    ``exerciser`` takes the faults only an active check finds."""
    return lambda params: apply_request(
        state, parse_request(params), mig=mig, kill_mps=kill_mps, exerciser=exerciser
    )


def _exerciser_faults(
    state: SimHealthState, exerciser: SimExerciserState | None, request: InjectRequest
) -> list[str]:
    """What an active check finds: a bad memory cell, a slow NVLink pair, a narrow PCIe link (NVML
    reports its width too), hung checks."""
    gpu = request.gpu
    done: list[str] = []
    if request.pcie_width is not None and gpu is not None:
        state.set_pcie_width(gpu, request.pcie_width)
        done.append(f"GPU {gpu}: PCIe link trained at x{request.pcie_width}")
    wanted = (request.bad_memory, request.slow_nvlink, request.check_hang)
    if exerciser is None and any(v is not None for v in wanted):
        raise SimHealthError("this simulated node has no active-check exerciser")
    if exerciser is not None and gpu is not None and request.bad_memory is not None:
        exerciser.add_bad_cell(gpu, request.bad_memory)
        done.append(f"GPU {gpu}: stuck memory cell at byte {request.bad_memory:#x}")
    if exerciser is not None and gpu is not None and request.slow_nvlink is not None:
        exerciser.slow_pair(gpu, request.slow_nvlink)
        done.append(f"NVLink pair GPU {gpu} - GPU {request.slow_nvlink}: half its lanes")
    if exerciser is not None and request.check_hang is not None:
        exerciser.hang(request.check_hang, gpu)
        where = "" if gpu is None else f" on GPU {gpu}"
        done.append(f"active checks hang {request.check_hang:g} s{where}")
    return done


def _kill_mps(kill_mps: Callable[[int], str] | None, gpu: int) -> str:
    if kill_mps is None:
        raise SimHealthError("this node agent supervises no MPS daemons (no fractional GPU)")
    return kill_mps(gpu)


def _mig_busy(mig: SimMigNode | None, gpu: int, instance: str, *, busy: bool) -> str:
    """Start or stop a process on one MIG device (``GI:CI``) of a simulated GPU."""
    gi, ci = _instance(instance)
    sim_gpu = mig.gpus.get(gpu) if mig is not None else None
    for gpu_instance, compute in sim_gpu.mig_devices() if sim_gpu is not None else ():
        if gpu_instance.id == gi and compute.id == (ci or 0):
            sim_gpu.set_busy(compute.mig_uuid, busy)  # type: ignore[union-attr]
            return f"GPU {gpu} MIG {instance}: {'busy' if busy else 'idle'}"
    raise SimHealthError(f"GPU {gpu} has no MIG device {instance} (GPU instance:compute instance)")


def _instance(text: str | None) -> tuple[int | None, int | None]:
    if text is None:
        return None, None
    gi, _, ci = text.partition(":")
    return int(gi), (int(ci) if ci else None)
