"""The interface every resource kind implements, and what it is handed.

One ``ResourceKind`` answers, for the resource names it owns:

- names: ``resources`` (fixed names) and ``prefixes`` (a family, ``nvidia.com/mig-*``), ``owns``;
- a pod's request: ``check_request`` (rules across one container's counts), ``scheduled`` (whether
  the extender counts it at all);
- a node's devices: ``gpu_devices`` (those one GPU offers) and ``node_devices`` (the rest);
- counting against a node and choosing a set in the extender: ``choose`` over ``KindSlot``s (the
  kinds the decision core does not plan itself, ``core_planned``);
- choosing a set in the device plugin: ``prefer`` (GetPreferredAllocation);
- Allocate: ``grant`` (env, device nodes, mounts, CDI names);
- status: ``fits_id`` (which IDs of an annotation may count) and ``describe`` (a grant in words).

Pure: values in, values out; no transport, no hardware.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from devicekinds.device import PluginDevice
from devicekinds.grant import ContainerGrant, GrantContext
from devicemodel.assignment import fits_resource
from devicemodel.inventory import Gpu, NodeInventory
from devicemodel.sharing import SharingPlan

GpuSetChooser = Callable[[frozenset[int], int, frozenset[int]], "tuple[int, ...] | None"]
"""(available GPU indexes, size, must-include indexes) -> the chosen indexes, or None."""

Devices = Sequence[PluginDevice]


@dataclass(frozen=True)
class PreferContext:
    """What GetPreferredAllocation knows beyond the candidates: the topology chooser of whole GPUs
    and the devices the same container was just given for a sibling resource."""

    gpu_chooser: GpuSetChooser | None = None
    near: Devices = ()


@dataclass(frozen=True)
class KindSlot:
    """A device as the extender's decisions see it: no ID, a position among its resource's devices."""

    position: int
    numa_node: int | None
    pcie_switch: str | None = None
    gpu_index: int | None = None


@dataclass(frozen=True)
class DeviceNames:
    """How a node's devices are named to an operator: GPU UUID -> index, MIG UUID -> words."""

    gpu_index: Mapping[str, int] = field(default_factory=dict)
    mig_names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceText:
    """One container's devices of one resource in words; ``gpu_indices`` for whole GPUs only."""

    text: str
    gpu_indices: tuple[int, ...] = ()


def short_id(device_id: str) -> str:
    return device_id if len(device_id) <= 16 else device_id[:15] + "…"


def fill(must: Devices, ordered: Devices, size: int) -> list[str]:
    """The must-include devices, then the first of ``ordered`` up to ``size``."""
    chosen = [d.id for d in must]
    for device in ordered:
        if len(chosen) >= size:
            break
        if device.id not in chosen:
            chosen.append(device.id)
    return chosen


def numa_key(device: PluginDevice) -> tuple[int, str]:
    return (device.numa_node if device.numa_node is not None else 1 << 16, device.id)


class ResourceKind(ABC):
    """One kind of device; see the module docstring for what each member answers."""

    words: tuple[str, ...] = ()  # the ``PluginDevice.kind`` of its devices
    resources: tuple[str, ...] = ()  # the fixed resource names it serves
    prefixes: tuple[str, ...] = ()  # resource-name families it serves (the MIG profiles)
    scheduled: bool = True  # False: the extender leaves it to kube-scheduler (the IMEX channel)
    core_planned: bool = False  # True: the extender's decision core plans it with its own planner
    # resource -> the resource whose last grant GetPreferredAllocation puts it beside (``near``)
    siblings: ClassVar[Mapping[str, str]] = {}

    def owns(self, resource: str) -> bool:
        return resource in self.resources or any(resource.startswith(p) for p in self.prefixes)

    # ---- a pod's request ------------------------------------------------------------------
    def check_request(self, counts: Mapping[str, int], *, container: str) -> str | None:
        """What is wrong with one container's counts (every gpuweave resource it asks), or None;
        ``container`` is the container's name as quoted in a message."""
        del counts, container
        return None

    # ---- a node's devices -----------------------------------------------------------------
    def gpu_devices(self, gpu: Gpu, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        """The devices ``gpu`` offers as this kind under ``plan`` (in unit order)."""
        del gpu, inventory, plan
        return []

    def node_devices(self, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        """The devices of this kind not made from one GPU (adapters, channels, lost GPUs)."""
        del inventory, plan
        return []

    def devices(self, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        """Every device of this kind on the node: per GPU in index order, then the rest."""
        per_gpu = [
            d
            for g in sorted(inventory.gpus, key=lambda g: g.index)
            for d in self.gpu_devices(g, inventory, plan)
        ]
        return per_gpu + self.node_devices(inventory, plan)

    # ---- choosing a set -------------------------------------------------------------------
    def choose(self, free: Sequence[KindSlot], need: int, *, near: Sequence[KindSlot]) -> tuple[int, ...]:
        """The extender's choice of ``need`` of the ``free`` slots (positions): by default the
        lowest NUMA node first, beside ``near`` (the GPUs the pod was given) when it can."""
        numas = {s.numa_node for s in near}
        ordered = sorted(
            free, key=lambda s: (s.numa_node not in numas, s.numa_node is None, s.numa_node or 0, s.position)
        )
        return tuple(s.position for s in ordered[:need])

    def prefer(self, candidates: Devices, must: Devices, size: int, context: PreferContext) -> list[str]:
        """GetPreferredAllocation's choice: by default the must-include ones, then by NUMA node."""
        del context
        return fill(must, sorted(candidates, key=numa_key), size)

    # ---- Allocate -------------------------------------------------------------------------
    @abstractmethod
    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        """What the container gets for ``chosen`` (validated devices of ``resource``, one kind)."""

    # ---- status ---------------------------------------------------------------------------
    def fits_id(self, resource: str, device_id: str) -> bool:
        """Whether ``device_id`` has the form of a device of ``resource`` (assignment trust)."""
        return fits_resource(resource, device_id)

    def describe(self, resource: str, ids: Sequence[str], names: DeviceNames) -> DeviceText:
        """One container's devices of ``resource`` in words (``gpuweave status``, Events)."""
        del names
        return DeviceText(f"{resource} " + ",".join(sorted(ids)))
