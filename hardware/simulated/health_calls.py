"""Simulated GPU faults: the NVML health call surface and an injection API.

``SimHealthState`` holds what can go wrong on a simulated node (pending Xid events, ECC counters,
remapped rows, NVLink links down, temperatures, PCIe width, a lost GPU, a hung driver, EFA
adapters down or missing) and the reset rules. ``HealthCallsMixin`` exposes it through pynvml's
function names so ``hardware.health_probe`` runs the same code against the simulation as on a GPU
host. Semantics follow NVML: events that happen before ``nvmlDeviceRegisterEvents`` are not
recorded; a lost GPU answers every call with GPU_IS_LOST; a hung driver blocks every call.

Faults written here also produce the kernel-log line the driver would write (``kmsg_path``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import Architecture
from hardware.fabric import FM_PID_FILE, FM_PROCESS

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_UNKNOWN = 999
EVENT_XID, EVENT_DBE, EVENT_RECOVERY = 0x8, 0x2, 0x8000
# nvmlDeviceGetSupportedEventTypes. Hopper: what an H200 answered on driver 580.159.04 (every type
# up to 0x8000 but power-source change 0x20 and MIG config change 0x40). Other families have no
# recording yet and keep the types the product registers, with single-bit ECC.
DEFAULT_EVENT_TYPES = EVENT_XID | EVENT_DBE | EVENT_RECOVERY | 0x1
_EVENT_TYPES = {Architecture.HOPPER: 0xFF9F}
# Ampere and later data-center GPUs remap rows instead of retiring pages: NVML answers
# nvmlDeviceGetRetiredPages* with NOT_SUPPORTED there (an H200 did, driver 580.159.04).
_ROW_REMAPPING = frozenset({Architecture.AMPERE, Architecture.HOPPER, Architecture.BLACKWELL})
_RECOVERY_NAMES = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset"}
NO_INSTANCE = 0xFFFFFFFF
FABRIC_STATES = ("not-started", "in-progress", "completed", "failed")
SIM_FABRIC_MANAGER_PID = 4242
_XID_MESSAGES = {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error was detected."}


class SimHealthError(GpuweaveError):
    """An injection the simulated node cannot apply (no such GPU, link or adapter)."""


class SimNvmlCallError(Exception):
    """An NVML return code raised by a simulated health call (the lib maps it to its NVMLError)."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(f"NVML error {code}: {detail}" if detail else f"NVML error {code}")
        self.code = code


@dataclass
class SimGpuHealth:
    uuid: str
    pci_bus_id: str
    nvlinks: int
    dbe: int = 0
    sbe: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pages: list[int] = field(default_factory=list)
    retired_pending: bool = False
    nvlinks_down: set[int] = field(default_factory=set)
    temperature_c: int = 40
    pcie_width: tuple[int, int] = (16, 16)
    pcie_generation: tuple[int, int] = (5, 5)
    lost: bool = False
    hang_until: float = 0.0
    processes: tuple[int, ...] = ()
    resets: int = 0
    recovery_action: int = 0
    reset_required: bool = False  # a pass-through VM's GPU: only a reboot resets it
    reset_fails: bool = False  # the GPU does not come back from a reset (it stays off the bus)
    # What the GPU's family supports (``describe``); kept across ``clear``.
    event_types: int = DEFAULT_EVENT_TYPES
    page_retirement: bool = True


@dataclass(frozen=True)
class SimEvent:
    index: int
    event_type: int
    data: int
    gpu_instance: int
    compute_instance: int


@dataclass
class SimEventData:
    """The fields of pynvml's ``c_nvmlEventData_t``."""

    device: Any
    eventType: int  # noqa: N815 (pynvml's field names)
    eventData: int  # noqa: N815
    gpuInstanceId: int  # noqa: N815
    computeInstanceId: int  # noqa: N815


class SimHealthState:
    """Fault state of one simulated node; thread-safe; ``kmsg_path`` receives kernel-log lines."""

    def __init__(
        self,
        gpus: list[tuple[str, str, int]],
        *,
        kmsg_path: Path | None = None,
        sysfs_root: Path | None = None,
        nvswitch: bool = False,
    ) -> None:
        self.gpus = [SimGpuHealth(uuid, bus, links) for uuid, bus, links in gpus]
        self.nvswitch = nvswitch
        # Open NVML sessions of the process that owns the library (set by it): like any client,
        # they hold every GPU open, and a reset refuses a GPU anyone holds.
        self.nvml_sessions: Callable[[], int] = lambda: 0
        self.fabric_state = "completed"  # as NVML (Hopper+) and the Fabric Manager (Ampere) report it
        self.kmsg_path = kmsg_path
        self.sysfs_root = sysfs_root
        self.global_hang_until = 0.0
        self._cond = threading.Condition()
        self._queues: dict[int, deque[SimEvent]] = {}
        self._masks: dict[int, dict[int, int]] = {}  # event set -> GPU index -> mask
        self._next_set = 1

    def gpu(self, index: int) -> SimGpuHealth:
        if not 0 <= index < len(self.gpus):
            raise SimHealthError(
                f"no GPU {index} on the simulated node (it has {len(self.gpus)}); pick 0-{len(self.gpus) - 1}"
            )
        return self.gpus[index]

    def describe(self, index: int, architecture: Architecture) -> None:
        """What GPU ``index`` supports as its family does: event types, page retirement."""
        gpu = self.gpu(index)
        gpu.event_types = _EVENT_TYPES.get(architecture, DEFAULT_EVENT_TYPES)
        gpu.page_retirement = architecture not in _ROW_REMAPPING

    # --- injection API ----------------------------------------------------------------------------

    def inject_xid(
        self, index: int, xid: int, *, gpu_instance: int | None = None, compute_instance: int | None = None
    ) -> str:
        """Raise an Xid as the driver would: an NVML event, a kernel-log line, and its side effects."""
        gpu = self.gpu(index)
        with self._cond:
            if xid == 79:
                gpu.lost = True
            elif xid == 48:
                gpu.dbe += 1
            elif xid == 63:
                gpu.remap_pending, gpu.remap_uncorrectable = True, gpu.remap_uncorrectable + 1
            elif xid == 64:
                gpu.remap_failure = True
            gi = NO_INSTANCE if gpu_instance is None else gpu_instance
            ci = NO_INSTANCE if compute_instance is None else compute_instance
            self._queue(SimEvent(index, EVENT_XID, xid, gi, ci))
        message = _XID_MESSAGES.get(xid, "simulated fault")
        line = xid_kernel_line(
            gpu.pci_bus_id, xid, message, gpu_instance=gpu_instance, compute_instance=compute_instance
        )
        self.write_kernel_log(line)
        return line

    def set_recovery_action(self, index: int, action: int) -> str:
        """The driver changes its recommended recovery action: Xid 154 and the 0x8000 NVML event."""
        gpu = self.gpu(index)
        with self._cond:
            previous, gpu.recovery_action = gpu.recovery_action, action
            self._queue(SimEvent(index, EVENT_RECOVERY, action, NO_INSTANCE, NO_INSTANCE))
        old, new = _RECOVERY_NAMES.get(previous, "Unknown"), _RECOVERY_NAMES.get(action, "Unknown")
        message = f"GPU recovery action changed from 0x{previous:x} ({old}) to 0x{action:x} ({new})"
        line = xid_kernel_line(gpu.pci_bus_id, 154, "").removesuffix(", ")
        line = line.replace("pid='<unknown>', name=<unknown>", message)
        self.write_kernel_log(line)
        return line

    def inject_ecc_dbe(self, index: int, count: int = 1) -> None:
        gpu = self.gpu(index)
        with self._cond:
            gpu.dbe += count
            self._queue(SimEvent(index, EVENT_DBE, 0, NO_INSTANCE, NO_INSTANCE))

    def set_nvlink_down(self, index: int, link: int) -> None:
        gpu = self.gpu(index)
        if not 0 <= link < max(gpu.nvlinks, 1):
            raise SimHealthError(
                f"GPU {index} has NVLink links 0-{gpu.nvlinks - 1}; link {link} does not exist"
            )
        with self._cond:
            gpu.nvlinks_down.add(link)

    def set_temperature(self, index: int, celsius: int) -> None:
        self.gpu(index).temperature_c = celsius

    def set_pcie_width(self, index: int, width: int) -> None:
        gpu = self.gpu(index)
        gpu.pcie_width = (width, gpu.pcie_width[1])

    def set_processes(self, index: int, pids: tuple[int, ...]) -> None:
        self.gpu(index).processes = tuple(pids)

    def hang(self, seconds: float, index: int | None = None) -> None:
        """Make NVML calls block for ``seconds`` (for one GPU's calls, or every call)."""
        until = time.monotonic() + seconds
        if index is None:
            self.global_hang_until = until
        else:
            self.gpu(index).hang_until = until

    def set_efa(self, name: str, *, link_up: bool | None = None, present: bool | None = None) -> None:
        """Take an EFA adapter's netdev down/up, or hide/restore the adapter in the sysfs tree."""
        if self.sysfs_root is None:
            raise SimHealthError("the simulated node has no sysfs tree; EFA faults need one")
        base = self.sysfs_root / "class" / "infiniband"
        hidden = self.sysfs_root / ".missing-efa" / name  # outside the class dir, as if unplugged
        hidden.parent.mkdir(exist_ok=True)
        if present is not None:
            source, target = (hidden, base / name) if present else (base / name, hidden)
            if source.exists():
                source.rename(target)
            elif not target.exists():
                raise SimHealthError(f"no EFA adapter {name!r} under {base}")
        if link_up is not None:
            states = sorted((base / name / "device" / "net").glob("*/operstate"))
            if not states:
                raise SimHealthError(
                    f"EFA adapter {name!r} has no netdev (an EFA-only interface): its link state cannot "
                    "be observed, only its disappearance; use --efa-missing"
                )
            for operstate in states:
                operstate.write_text("up\n" if link_up else "down\n")

    def set_fabric_state(self, state: str) -> None:
        """The NVSwitch fabric's state; on the host, the Fabric Manager runs unless not started or failed."""
        if state not in FABRIC_STATES:
            raise SimHealthError(f"fabric state {state!r} is not one of {', '.join(FABRIC_STATES)}")
        if not self.nvswitch:
            raise SimHealthError("the simulated node has no NVSwitch fabric (its profile has no nvswitch)")
        self.fabric_state = state
        if self.sysfs_root is not None:
            write_fabric_manager(self.sysfs_root.parent, running=state not in ("not-started", "failed"))

    def stall_efa(self, name: str) -> None:
        """The adapter stops completing admin commands, as a failed EFA device does: its
        ``no_completion_cmds`` and ``cmds_err`` counters rise (its verbs port still reads ACTIVE)."""
        if self.sysfs_root is None:
            raise SimHealthError("the simulated node has no sysfs tree; EFA faults need one")
        counters = self.sysfs_root / "class" / "infiniband" / name / "hw_counters"
        if not counters.is_dir():
            where = counters.parent.parent
            raise SimHealthError(f"no EFA adapter {name!r} with hardware counters under {where}")
        for counter in ("no_completion_cmds", "cmds_err"):
            path = counters / counter
            path.write_text(f"{int(path.read_text()) + 1}\n")

    def clear(self, index: int | None = None) -> None:
        """Undo every injected fault (of one GPU, or of the node including EFA and hangs)."""
        targets = self.gpus if index is None else [self.gpu(index)]
        with self._cond:
            for gpu in targets:
                fresh = SimGpuHealth(
                    gpu.uuid,
                    gpu.pci_bus_id,
                    gpu.nvlinks,
                    resets=gpu.resets,
                    event_types=gpu.event_types,
                    page_retirement=gpu.page_retirement,
                )
                gpu.__dict__.update(fresh.__dict__)
            if index is None:
                self.global_hang_until = 0.0
        if index is None and self.nvswitch and self.fabric_state != "completed":
            self.set_fabric_state("completed")
        if index is None and self.sysfs_root is not None:
            base = self.sysfs_root / "class" / "infiniband"
            stash = self.sysfs_root / ".missing-efa"
            for hidden in stash.iterdir() if stash.is_dir() else []:
                hidden.rename(base / hidden.name)
            for operstate in base.glob("*/device/net/*/operstate"):
                operstate.write_text("up\n")

    def reset(self, index: int) -> None:
        """A GPU reset: refused while processes use the GPU; clears volatile state, applies remaps."""
        gpu = self.gpu(index)
        self._wait_out_hang(index)
        with self._cond:
            if gpu.processes:
                raise SimNvmlCallError(
                    NVML_ERROR_IN_USE, f"GPU {index} is in use by pids {list(gpu.processes)}"
                )
            if self.nvml_sessions() > 0 or any(masks.get(index) for masks in self._masks.values()):
                raise SimNvmlCallError(
                    NVML_ERROR_IN_USE, f"GPU {index} is in use by another client (NVML session or event set)"
                )
            if gpu.reset_required:
                raise SimNvmlCallError(NVML_ERROR_RESET_REQUIRED, f"GPU {index} requires a reboot")
            if gpu.reset_fails:
                gpu.resets += 1
                raise SimNvmlCallError(NVML_ERROR_UNKNOWN, f"GPU {index} did not come back from the reset")
            gpu.dbe = gpu.sbe = 0
            gpu.remap_pending = False
            gpu.lost = False
            gpu.nvlinks_down.clear()
            gpu.recovery_action = 0
            gpu.resets += 1

    def set_reset_fails(self, index: int, fails: bool = True) -> None:
        """From now on a reset of the GPU fails: it stays off the bus (a GPU that fell off the bus
        and does not come back; only a reboot or the machine's replacement would tell more)."""
        with self._cond:
            self.gpu(index).reset_fails = fails

    def reset_uuid(self, uuid: str) -> None:
        """``reset`` by GPU UUID (what ``nvidia-smi -r -i <uuid>`` takes)."""
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                self.reset(index)
                return
        raise SimHealthError(f"no GPU {uuid} on the simulated node")

    def write_kernel_log(self, line: str) -> None:
        if self.kmsg_path is None:
            return
        self.kmsg_path.parent.mkdir(parents=True, exist_ok=True)
        with self.kmsg_path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    # --- used by the call surface ----------------------------------------------------------------

    def _queue(self, event: SimEvent) -> None:
        for set_id, masks in self._masks.items():
            if masks.get(event.index, 0) & event.event_type:
                self._queues[set_id].append(event)
        self._cond.notify_all()

    def wait_if_hung(self, index: int | None) -> None:
        """Block while the driver hangs (the whole node, or this GPU); then fail if the GPU is lost."""
        self._wait_out_hang(index)
        if index is not None and self.gpus[index].lost:
            raise SimNvmlCallError(NVML_ERROR_GPU_IS_LOST, f"GPU {index} has fallen off the bus")

    def _wait_out_hang(self, index: int | None) -> None:
        while True:
            until = max(self.global_hang_until, self.gpus[index].hang_until if index is not None else 0.0)
            remaining = until - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(remaining, 0.05))

    def create_event_set(self) -> int:
        with self._cond:
            set_id, self._next_set = self._next_set, self._next_set + 1
            self._queues[set_id], self._masks[set_id] = deque(), {}
            return set_id

    def register(self, set_id: int, index: int, mask: int) -> None:
        with self._cond:
            if set_id not in self._masks:
                raise SimNvmlCallError(NVML_ERROR_INVALID_ARGUMENT, f"no event set {set_id}")
            self._masks[set_id][index] = self._masks[set_id].get(index, 0) | mask

    def wait_event(self, set_id: int, timeout_ms: int) -> SimEvent:
        self.wait_if_hung(None)
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            queue = self._queues.get(set_id)
            if queue is None:
                raise SimNvmlCallError(NVML_ERROR_INVALID_ARGUMENT, f"no event set {set_id}")
            while not queue:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SimNvmlCallError(NVML_ERROR_TIMEOUT, "no event")
                self._cond.wait(remaining)
            return queue.popleft()

    def free_event_set(self, set_id: int) -> None:
        with self._cond:
            self._queues.pop(set_id, None)
            self._masks.pop(set_id, None)


def write_fabric_manager(root: Path, *, running: bool) -> None:
    """The Fabric Manager's host files below ``root``: its pid file and ``proc/<pid>/comm`` while it
    runs, neither when it does not (what ``hardware.fabric`` reads on Ampere boards)."""
    pid_file = root / FM_PID_FILE
    comm = root / "proc" / str(SIM_FABRIC_MANAGER_PID) / "comm"
    if not running:
        pid_file.unlink(missing_ok=True)
        comm.unlink(missing_ok=True)
        return
    for path, text in ((comm, FM_PROCESS), (pid_file, str(SIM_FABRIC_MANAGER_PID))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text}\n", encoding="utf-8")


def xid_kernel_line(
    pci_bus_id: str,
    xid: int,
    message: str,
    *,
    gpu_instance: int | None = None,
    compute_instance: int | None = None,
) -> str:
    """The NVRM line the driver writes for an Xid (``NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 31, ...``)."""
    domain, bus, device = (int(p, 16) for p in pci_bus_id.split(".", maxsplit=1)[0].split(":"))
    where = f"PCI:{domain:04x}:{bus:02x}:{device:02x}"
    if gpu_instance is not None:
        where += f" GPU-I:{gpu_instance:02d}"
        if compute_instance is not None:
            where += f" GPU-CI:{compute_instance:02d}"
    return f"NVRM: Xid ({where}): {xid}, pid='<unknown>', name=<unknown>, {message}"


class HealthCallsMixin:
    """pynvml health functions over ``self.health`` (a ``SimHealthState``).

    The host library provides ``NVMLError`` (built from a return code, as pynvml's is),
    ``nvmlDeviceGetIndex(handle)`` and ``nvmlDeviceGetHandleByIndex(index)``, and sets ``health``.
    """

    health: SimHealthState

    def _health_index(self, handle: Any) -> int:
        return int(getattr(self, "nvmlDeviceGetIndex")(handle))  # noqa: B009 (provided by the host library)

    def _health_handle(self, index: int) -> Any:
        return getattr(self, "nvmlDeviceGetHandleByIndex")(index)  # noqa: B009

    def _health_error(self, code: int) -> Exception:
        error: Exception = getattr(self, "NVMLError")(code)  # noqa: B009
        return error

    def _health_gpu(self, handle: Any) -> SimGpuHealth:
        index = self._health_index(handle)
        try:
            self.health.wait_if_hung(index)
        except SimNvmlCallError as exc:
            raise self._health_error(exc.code) from exc
        return self.health.gpus[index]

    def nvmlEventSetCreate(self) -> int:  # noqa: N802 (pynvml's names)
        return self.health.create_event_set()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: int) -> None:  # noqa: N802
        self._health_gpu(handle)
        self.health.register(event_set, self._health_index(handle), int(event_types))

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimEventData:  # noqa: N802
        try:
            event = self.health.wait_event(event_set, timeout_ms)
        except SimNvmlCallError as exc:
            raise self._health_error(exc.code) from exc
        handle = self._health_handle(event.index)
        return SimEventData(handle, event.event_type, event.data, event.gpu_instance, event.compute_instance)

    def nvmlEventSetWait(self, event_set: int, timeout_ms: int) -> SimEventData:  # noqa: N802
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:  # noqa: N802
        return self._health_gpu(handle).event_types

    def nvmlEventSetFree(self, event_set: int) -> None:  # noqa: N802
        self.health.free_event_set(event_set)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:  # noqa: N802
        gpu = self._health_gpu(handle)
        return gpu.dbe if error_type == 1 else gpu.sbe

    def nvmlDeviceGetMemoryErrorCounter(  # noqa: N802
        self, handle: Any, error_type: int, counter_type: int, location: int
    ) -> int:
        gpu = self._health_gpu(handle)
        return (gpu.dbe if error_type == 1 else gpu.sbe) if location == 1 else 0  # all in device memory

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:  # noqa: N802
        gpu = self._health_gpu(handle)
        return gpu.remap_correctable, gpu.remap_uncorrectable, int(gpu.remap_pending), int(gpu.remap_failure)

    def nvmlDeviceGetRetiredPages(self, handle: Any, source_filter: int) -> list[int]:  # noqa: N802
        return list(self._retiring_gpu(handle).retired_pages)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:  # noqa: N802
        return int(self._retiring_gpu(handle).retired_pending)

    def _retiring_gpu(self, handle: Any) -> SimGpuHealth:
        gpu = self._health_gpu(handle)
        if not gpu.page_retirement:
            raise self._health_error(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:  # noqa: N802
        gpu = self._health_gpu(handle)
        if not 0 <= link < gpu.nvlinks:
            raise self._health_error(NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in gpu.nvlinks_down else 1

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:  # noqa: N802
        return self._health_gpu(handle).temperature_c

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:  # noqa: N802
        return self._health_gpu(handle).pcie_width[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:  # noqa: N802
        return self._health_gpu(handle).pcie_width[1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._health_gpu(handle).pcie_generation[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._health_gpu(handle).pcie_generation[1]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:  # noqa: N802
        return [SimProcess(pid) for pid in self._health_gpu(handle).processes]


@dataclass(frozen=True)
class SimProcess:
    """The fields of pynvml's ``c_nvmlProcessInfo_t`` that callers read."""

    pid: int
    usedGpuMemory: int = 0  # noqa: N815
