"""Record every NVML answer the product reads, as plain data: the fixture ``scripts/gpu-check`` writes.

The simulator was written from documentation; a recording from a real GPU host is what holds it
to the driver. ``NvmlRecorder`` asks the injected library (pynvml or the simulated one) the calls
the node agent, discovery, the MIG manager and the health checks make, read-only, and keeps each
answer or the NVML error it returned. ``hardware.nvml_fixture`` turns answers into JSON and
compares two recordings; the replay test records the simulator configured as the same product
and compares it with every committed fixture.

Nothing here changes the machine: only getters are called (no MIG mode, reset, clock, power,
persistence or compute-mode call), and no serial number, board part number or host name is read.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hardware.backend import HardwareError
from hardware.mig_ops import COMPUTE_INSTANCE_PROFILE_COUNT, GPU_INSTANCE_PROFILE_COUNT
from hardware.nvml_call import NvmlCaller
from hardware.nvml_fixture import Entry, encode_answer, encode_error

_MEMORY_ERROR_CORRECTED, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC, _TEMPERATURE_GPU = 0, 1, 0, 0
_NVLINK_LIMIT = 36  # NVML_NVLINK_MAX_LINKS in nvml.h 12.x; pynvml's constant when it has one
_HANDLE_CALLS = frozenset(
    {"nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId"}
)
_NO_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # opaque: recorded as "handle"

# Struct fields the product reads, per call (a recording keeps these only).
_SYSTEM_CALLS = ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion")
_FIELDS: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetMemoryInfo": ("total",),
    "nvmlDeviceGetPciInfo": ("busId",),
    "nvmlDeviceGetNvLinkRemotePciInfo": ("busId",),
    "nvmlDeviceGetAttributes": ("memorySizeMB", "gpuInstanceSliceCount", "computeInstanceSliceCount"),
    "nvmlDeviceGetGpuInstanceProfileInfo": ("id", "sliceCount", "instanceCount", "memorySizeMB"),
    "nvmlGpuInstanceGetInfo": ("device", "id", "profileId", "placement"),
    "nvmlGpuInstanceGetComputeInstanceProfileInfo": ("id", "sliceCount", "instanceCount"),
    "nvmlComputeInstanceGetInfo": ("device", "id", "profileId"),
    "nvmlDeviceGetGpuFabricInfoV": ("state", "status", "clusterUuid", "cliqueId", "healthMask"),
}


@dataclass
class NvmlRecorder:
    """Asks one library the product's read-only calls; ``entries`` holds the answers in call order."""

    caller: NvmlCaller
    entries: list[Entry] = field(default_factory=list)

    @property
    def lib(self) -> Any:
        return self.caller.lib

    def record(self) -> list[Entry]:
        """Every answer, system first, then per GPU; the library must already be initialised."""
        for call in _SYSTEM_CALLS:
            self.ask(call, (), partial(self.caller.invoke, call))
        count = self.ask("nvmlDeviceGetCount", (), partial(self.caller.invoke, "nvmlDeviceGetCount"))
        handles = [self.caller.invoke("nvmlDeviceGetHandleByIndex", i) for i in range(int(count or 0))]
        self._record_lookups(len(handles))
        for index, handle in enumerate(handles):
            self._record_gpu(index, handle)
            self._record_topology(index, handles)
        return self.entries

    def _record_lookups(self, count: int) -> None:
        """Each GPU found again by UUID and by PCI bus ID (as health and fabric checks find it),
        and the errors for an index past the last GPU and for a UUID no GPU has."""
        invoke = self.caller.invoke
        by_index, by_uuid = "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID"
        self.ask(by_index, ("past-last",), partial(invoke, by_index, count))
        self.ask(by_uuid, ("unknown",), partial(invoke, by_uuid, _NO_UUID))
        for index in range(count):
            handle = invoke("nvmlDeviceGetHandleByIndex", index)
            uuid = invoke("nvmlDeviceGetUUID", handle)
            bus_id = invoke("nvmlDeviceGetPciInfo", handle).busId
            for call, key in ((by_uuid, uuid), ("nvmlDeviceGetHandleByPciBusId", bus_id)):
                found = self.ask(call, (f"gpu{index}",), partial(invoke, call, key))
                if found is not None:
                    index_of = partial(invoke, "nvmlDeviceGetIndex", found)
                    self.ask("nvmlDeviceGetIndex", (call, f"gpu{index}"), index_of)

    def ask(self, call: str, args: tuple[object, ...], thunk: Callable[[], Any]) -> Any:
        """Make one call, keep its answer (or its error) under ``call`` and the symbolic ``args``."""
        try:
            value = thunk()
        except HardwareError as exc:
            self.entries.append(Entry(call, args, encode_error(exc, self.lib)))
            return None
        answer = {"ok": "handle"} if call in _HANDLE_CALLS else encode_answer(value, fields=_FIELDS.get(call))
        self.entries.append(Entry(call, args, answer))
        return value

    def _gpu_call(self, call: str, handle: Any, label: str, *more: object) -> Any:
        return self.ask(call, (label, *more), partial(self.caller.invoke, call, handle, *more))

    # -- one GPU -------------------------------------------------------------------------------

    def _record_gpu(self, index: int, handle: Any) -> None:
        gpu = f"gpu{index}"
        for call in (
            "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetMinorNumber", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetArchitecture",
            "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetSupportedEventTypes",
            "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus",
            "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth",
            "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
            "nvmlDeviceGetComputeRunningProcesses",
        ):
            self._gpu_call(call, handle, gpu)
        for kind in (_MEMORY_ERROR_UNCORRECTED, _MEMORY_ERROR_CORRECTED):
            self._gpu_call("nvmlDeviceGetTotalEccErrors", handle, gpu, kind, _VOLATILE_ECC)
        self._gpu_call("nvmlDeviceGetTemperature", handle, gpu, _TEMPERATURE_GPU)
        self._record_fabric(handle, gpu)
        self._record_nvlinks(handle, gpu)
        mode = self._gpu_call("nvmlDeviceGetMigMode", handle, gpu)
        if mode is not None:
            self._record_mig(handle, gpu, enabled=int(mode[0]) == 1)

    def _record_fabric(self, handle: Any, gpu: str) -> None:
        struct = getattr(self.lib, "c_nvmlGpuFabricInfoV_t", None)
        if struct is None:
            return
        info = struct()

        def fill() -> Any:
            self.caller.invoke("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info))
            return info

        self.ask("nvmlDeviceGetGpuFabricInfoV", (gpu,), fill)

    def _record_nvlinks(self, handle: Any, gpu: str) -> None:
        """Each link's state up to the first error (past the last link, or no NVLink at all)."""
        for link in range(int(getattr(self.lib, "NVML_NVLINK_MAX_LINKS", _NVLINK_LIMIT))):
            state = self._gpu_call("nvmlDeviceGetNvLinkState", handle, gpu, link)
            if state is None:
                return
            if int(state) == 1:
                self._gpu_call("nvmlDeviceGetNvLinkRemotePciInfo", handle, gpu, link)
                self._gpu_call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, gpu, link)

    def _record_topology(self, index: int, handles: list[Any]) -> None:
        for peer in range(index + 1, len(handles)):
            call = "nvmlDeviceGetTopologyCommonAncestor"
            pair = partial(self.caller.invoke, call, handles[index], handles[peer])
            self.ask(call, (f"gpu{index}", f"gpu{peer}"), pair)

    # -- MIG -----------------------------------------------------------------------------------

    def _record_mig(self, handle: Any, gpu: str, *, enabled: bool) -> None:
        """Profiles and placements (both modes); instances and MIG devices when MIG is on."""
        profile_ids: list[int] = []
        for profile_index in range(GPU_INSTANCE_PROFILE_COUNT):
            info = self._gpu_call("nvmlDeviceGetGpuInstanceProfileInfo", handle, gpu, profile_index)
            if info is not None:
                profile_ids.append(int(info.id))
                self._record_placements(handle, gpu, int(info.id), int(info.instanceCount))
        self._gpu_call("nvmlDeviceGetMaxMigDeviceCount", handle, gpu)
        if not enabled:
            return
        for profile_id in profile_ids:
            self._record_gpu_instances(handle, gpu, profile_id)
        self._record_mig_devices(handle, gpu)

    def _record_placements(self, handle: Any, gpu: str, profile_id: int, capacity: int) -> None:
        array = (self.lib.c_nvmlGpuInstancePlacement_t * max(8, capacity))()
        count = ctypes.c_uint(len(array))

        def fill() -> Any:
            self.caller.invoke("nvmlDeviceGetGpuInstancePossiblePlacements", handle, profile_id, array,
                               ctypes.byref(count))
            return [(int(p.start), int(p.size)) for p in array[: count.value]]

        self.ask("nvmlDeviceGetGpuInstancePossiblePlacements", (gpu, profile_id), fill)

    def _record_gpu_instances(self, handle: Any, gpu: str, profile_id: int) -> None:
        array = (self.lib.c_nvmlGpuInstance_t * 8)()
        count = ctypes.c_uint(len(array))

        def fill() -> Any:
            self.caller.invoke("nvmlDeviceGetGpuInstances", handle, profile_id, array, ctypes.byref(count))
            return list(array[: count.value])

        instances = self.ask("nvmlDeviceGetGpuInstances", (gpu, profile_id), lambda: len(fill()))
        for position, gi in enumerate(list(array[: count.value]) if instances else []):
            label = f"{gpu}/profile{profile_id}/gi{position}"
            call = "nvmlGpuInstanceGetInfo"
            info = self.ask(call, (label,), self._related(call, gi, handle))
            if info is not None:
                self._record_compute_instances(gi, label, handle)

    def _record_compute_instances(self, gi: Any, label: str, parent: Any) -> None:
        for ci_index in range(COMPUTE_INSTANCE_PROFILE_COUNT):
            call = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
            profile = self.ask(call, (label, ci_index), partial(self.caller.invoke, call, gi, ci_index, 0))
            if profile is None:
                continue
            array = (self.lib.c_nvmlComputeInstance_t * max(1, int(profile.instanceCount)))()
            count = ctypes.c_uint(len(array))
            call = "nvmlGpuInstanceGetComputeInstances"
            fill = partial(self.caller.invoke, call, gi, profile.id, array, ctypes.byref(count))
            listed = self.ask(call, (label, ci_index), fill)
            for position, ci in enumerate(array[: count.value] if listed is not None else []):
                where = (f"{label}/ci{ci_index}.{position}",)
                call = "nvmlComputeInstanceGetInfo"
                self.ask(call, where, self._related(call, ci, parent))

    def _related(self, call: str, instance: Any, parent: Any) -> Callable[[], Any]:
        """An info call whose ``device`` handle is recorded as what it names: "parent" or another device."""

        def answer() -> Any:
            info = self.caller.invoke(call, instance)
            uuid = self.caller.invoke("nvmlDeviceGetUUID", info.device)
            same = uuid == self.caller.invoke("nvmlDeviceGetUUID", parent)
            return _Related(info, "parent" if same else f"other:{str(uuid)[:4]}")

        return answer

    def _record_mig_devices(self, handle: Any, gpu: str) -> None:
        limit = int(self.caller.invoke("nvmlDeviceGetMaxMigDeviceCount", handle))
        for slot in range(limit):
            mig = self._gpu_call("nvmlDeviceGetMigDeviceHandleByIndex", handle, gpu, slot)
            if mig is None:
                continue
            label = f"{gpu}/mig{slot}"
            for call in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetUUID",
                         "nvmlDeviceGetName", "nvmlDeviceGetAttributes", "nvmlDeviceGetMemoryInfo"):
                self._gpu_call(call, mig, label)


class _Related:
    """An info struct seen through ``encode_answer``: its fields, with ``device`` as a relation."""

    def __init__(self, info: Any, device: str) -> None:
        self._info = info
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._info, name)
