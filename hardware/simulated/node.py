"""The mutable state of one simulated GPU node, built from its inventory (or a node profile).

The fake pynvml library and the fake sysfs tree both read this one object, so a fault injected
here (a GPU lost, a call hung, an NVLink down, a MIG reshape) shows up on every path the
production readers take. MIG state lives in ``SimMigNode``, fault state in ``SimHealthState`` and the
faults only an active check finds in ``SimExerciserState``, the processes on its GPUs in
``SimProcessTable``;
this object adds device handles, the per-link NVLink wiring and call gates (hangs that block a
call until released).
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field
from pathlib import Path

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfile, NodeProfileSpec
from hardware.mig_catalog import MigCatalog, default_catalog
from hardware.simulated.exerciser import SimExerciserState
from hardware.simulated.health_calls import SimHealthState
from hardware.simulated.mig_calls import SimMigNode
from hardware.simulated.process_calls import SimProcessTable

DEVICE_HANDLE_BASE = 0x6000_0000  # GPU handles; MIG handles come from SimMigNode's allocator
DEFAULT_HANG_LIMIT_S = 120.0
_NVSWITCHES_BY_LANES = {18: 4, 12: 6}  # Hopper HGX: 4 NVSwitches; Ampere HGX: 6


@dataclass
class Hang:
    """A gate that blocks matching NVML calls until ``release()`` (or the node's hang limit)."""

    call: str  # fnmatch pattern over call names; "*" for every call
    gpu: int | None  # None: calls on any GPU, and calls not about a GPU
    released: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)  # a call is (or was) blocked

    def matches(self, call: str, gpu: int | None) -> bool:
        return fnmatch.fnmatchcase(call, self.call) and (self.gpu is None or self.gpu == gpu)

    def release(self) -> None:
        self.released.set()


ACTIVITY_FILE = "sim-exerciser-activity.jsonl"  # beside the faults file: when each check ran


class SimulatedNode:
    """One node's simulated GPUs: handles, NVLink wiring, MIG state, faults and call gates."""

    def __init__(
        self,
        inventory: NodeInventory,
        *,
        catalog: MigCatalog | None = None,
        sysfs_root: Path | None = None,
        kmsg_path: Path | None = None,
        hang_limit_s: float = DEFAULT_HANG_LIMIT_S,
        exerciser_faults: Path | None = None,
    ) -> None:
        self.inventory = inventory
        self.hang_limit_s = hang_limit_s
        self.link_remotes = _wire_links(inventory)
        self.mig = _mig_node(inventory, catalog or default_catalog())
        self.health = SimHealthState(
            [(g.uuid, g.pci_bus_id, len(self.link_remotes[g.index])) for g in inventory.gpus],
            kmsg_path=kmsg_path,
            sysfs_root=sysfs_root / "sys" if sysfs_root is not None else None,
            nvswitch=inventory.nvswitch is not None,
        )
        for gpu in inventory.gpus:
            self.health.describe(gpu.index, gpu.architecture)
        # faults only an active check finds; ``exerciser_faults`` keeps them across agent restarts
        self.exerciser = SimExerciserState(
            len(inventory.gpus),
            faults_file=exerciser_faults,
            activity_file=exerciser_faults.with_name(ACTIVITY_FILE) if exerciser_faults else None,
        )
        # processes on the GPUs, with their pods' cgroups under the fake /proc (``proc_root``)
        self.processes = SimProcessTable(self.health, proc_root=self.proc_root(sysfs_root))
        self._handles = {g.index: DEVICE_HANDLE_BASE + g.index for g in inventory.gpus}

        self._lock = threading.Lock()
        self._hangs: list[Hang] = []

    @classmethod
    def from_profile(
        cls, profile: NodeProfile | NodeProfileSpec, *, node_name: str | None = None, **options: object
    ) -> SimulatedNode:
        if isinstance(profile, NodeProfile):
            inventory = profile.to_inventory(node_name=node_name)
        else:
            inventory = profile.to_inventory(node_name=node_name or "simulated-node")
        return cls(inventory, **options)  # type: ignore[arg-type]

    @staticmethod
    def proc_root(sysfs_root: Path | None) -> Path | None:
        """The simulated host's ``/proc``: beside its ``sys/`` (health's reset checks read it too)."""
        return sysfs_root / "proc" if sysfs_root is not None else None

    # -- handles -------------------------------------------------------------------------------

    def handle_of(self, index: int) -> int:
        return self._handles[index]

    def index_of(self, handle: object) -> int | None:
        value = getattr(handle, "value", handle)
        index = value - DEVICE_HANDLE_BASE if isinstance(value, int) else -1
        return index if index in self._handles else None

    # -- faults and gates ----------------------------------------------------------------------

    def hang(self, call: str = "*", *, gpu: int | None = None) -> Hang:
        """Block NVML calls named like ``call`` (on GPU ``gpu``, or all) until the gate is released.

        ``call`` is an fnmatch pattern over pynvml function names; MIG calls pass the gate as
        ``mig`` and health reads as ``health``, so ``"*"`` hangs the whole driver.
        """
        gate = Hang(call, gpu)
        with self._lock:
            self._hangs.append(gate)
        return gate

    def release_hangs(self) -> None:
        with self._lock:
            gates, self._hangs = self._hangs, []
        for gate in gates:
            gate.release()

    def wait_at_gates(self, call: str, gpu: int | None) -> None:
        """Called by the library on every call: blocks while a matching gate is closed."""
        with self._lock:
            gates = [g for g in self._hangs if g.matches(call, gpu) and not g.released.is_set()]
        for gate in gates:
            gate.entered.set()
            gate.released.wait(self.hang_limit_s)

    def set_gpu_lost(self, index: int, lost: bool = True) -> None:
        """The GPU falls off the bus: every call about it answers GPU_IS_LOST (Xid 79)."""
        self.health.gpu(index).lost = lost


def _mig_node(inventory: NodeInventory, catalog: MigCatalog) -> SimMigNode:
    for gpu in inventory.gpus:
        if gpu.mig_capable and not catalog.supports(gpu.product):
            raise InvalidInputError(
                f"GPU {gpu.index} ({gpu.product}) is migCapable but the MIG catalog has no profile "
                "table for it; set migCapable: false or use a catalogued product name"
            )
    return SimMigNode.from_inventory(inventory, catalog)


def nvswitch_bus_ids(inventory: NodeInventory) -> tuple[str, ...]:
    """PCI bus ids of the simulated NVSwitches: free buses, so no GPU is mistaken for one."""
    if inventory.nvswitch is None:
        return ()
    lanes = inventory.nvswitch.links_per_gpu
    count = _NVSWITCHES_BY_LANES.get(lanes, min(lanes, 6))
    used = {g.pci_bus_id for g in inventory.gpus}
    candidates = (f"00000000:{bus:02X}:00.0" for bus in range(0x01, 0x100))
    free = [bus_id for bus_id in candidates if bus_id not in used]
    return tuple(free[:count])


def _wire_links(inventory: NodeInventory) -> dict[int, list[str]]:
    """Remote PCI bus id of each NVLink lane, per GPU: direct peers first, then NVSwitches."""
    remotes: dict[int, list[str]] = {g.index: [] for g in inventory.gpus}
    for link in inventory.nvlinks:
        remotes[link.gpu_a].extend([inventory.gpu(link.gpu_b).pci_bus_id] * link.links)
        remotes[link.gpu_b].extend([inventory.gpu(link.gpu_a).pci_bus_id] * link.links)
    switches = nvswitch_bus_ids(inventory)
    fabric = inventory.nvswitch
    if fabric is not None:
        for index in fabric.gpus:
            remotes[index].extend(switches[lane % len(switches)] for lane in range(fabric.links_per_gpu))
    return remotes
