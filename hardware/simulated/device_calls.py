# ruff: noqa: N802, N803 - the fake keeps pynvml's function and argument names
"""pynvml's init, system, device and NVLink functions over a ``SimulatedNode``.

Same names, arguments and results as pynvml: ``nvmlDeviceGetPciInfo(handle).busId`` is a str,
``nvmlDeviceGetCudaComputeCapability`` a ``(major, minor)`` tuple, errors ``NVMLError(code)``.
Every call first passes the node's gates (an injected hang blocks it) and its fault state (a lost
GPU answers GPU_IS_LOST), and fails with UNINITIALIZED before ``nvmlInit``, as NVML does.
MIG-device handles are accepted where NVML accepts them (name, memory, attributes).
"""

from __future__ import annotations

import uuid
from typing import Any

from devicemodel.inventory import Architecture, Gpu
from devicemodel.spec_checks import MAX_NVLINKS
from hardware.simulated.health_calls import SimNvmlCallError
from hardware.simulated.mig_state import SimComputeInstance, SimGpuInstance
from hardware.simulated.node import SimulatedNode
from hardware.simulated.structs import (
    DeviceAttributes,
    Memory,
    NvmlConstants,
    NVMLError,
    PciInfo,
    c_nvmlGpuFabricInfoV_t,
)
from topology.links import LinkClass
from topology.pcie import pcie_class, place_of, switch_root_ports

_MIB = 1024 * 1024
_SMS_PER_SLICE = 16
_ARCH_CODES = {
    Architecture.KEPLER: NvmlConstants.NVML_DEVICE_ARCH_KEPLER,
    Architecture.MAXWELL: NvmlConstants.NVML_DEVICE_ARCH_MAXWELL,
    Architecture.PASCAL: NvmlConstants.NVML_DEVICE_ARCH_PASCAL,
    Architecture.VOLTA: NvmlConstants.NVML_DEVICE_ARCH_VOLTA,
    Architecture.TURING: NvmlConstants.NVML_DEVICE_ARCH_TURING,
    Architecture.AMPERE: NvmlConstants.NVML_DEVICE_ARCH_AMPERE,
    Architecture.ADA: NvmlConstants.NVML_DEVICE_ARCH_ADA,
    Architecture.HOPPER: NvmlConstants.NVML_DEVICE_ARCH_HOPPER,
    Architecture.BLACKWELL: NvmlConstants.NVML_DEVICE_ARCH_BLACKWELL,
}
_FABRIC_ARCHITECTURES = (Architecture.HOPPER, Architecture.BLACKWELL)  # Ampere: Fabric Manager only
_FABRIC_STATES = {"not-started": 1, "in-progress": 2, "completed": 3, "failed": 3}
_FABRIC_HEALTHY_MASK = (2 << 4) | (1 << 8)  # route unhealthy: false; incorrect configuration: none
_MigTarget = tuple[int, SimGpuInstance, SimComputeInstance | None]


class SimulatedLibBase(NvmlConstants):
    """Plumbing every call mixin shares: the node, init state, gates, handle resolution."""

    NVMLError = NVMLError
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t  # noqa: N815 (pynvml's name)
    node: SimulatedNode
    _init_count: int = 0

    def _enter(self, call: str, gpu: int | None = None) -> None:
        """Gates first (a hung driver blocks even calls that would fail), then init and faults."""
        self.node.wait_at_gates(call, gpu)
        try:
            self.node.health.wait_if_hung(gpu)
        except SimNvmlCallError as exc:
            raise NVMLError(exc.code) from None
        if self._init_count <= 0:
            raise NVMLError(self.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, call: str, handle: Any) -> Gpu:
        """The GPU a device handle names (after gates and faults)."""
        index = self.node.index_of(handle)
        if index is None:
            self._enter(call)
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        self._enter(call, index)
        return self.node.inventory.gpu(index)

    def _device(self, call: str, handle: Any) -> tuple[Gpu, _MigTarget | None]:
        """A GPU handle, or a MIG-device handle with its parent GPU."""
        if self.node.index_of(handle) is not None:
            return self._gpu(call, handle), None
        if self.node.mig.kind(handle) != "mig_device":  # a GI or CI handle is no device, as in NVML
            self._enter(call)
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        index, _, gi, ci = self.node.mig.lookup(handle)
        self._enter(call, index)
        return self.node.inventory.gpu(index), (index, gi, ci)


class InitCalls(SimulatedLibBase):
    def nvmlInit(self) -> None:
        self.node.wait_at_gates("nvmlInit", None)
        self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._init_count -= 1


class SystemCalls(SimulatedLibBase):
    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.node.inventory.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        """NVML's own version: the CUDA major version, then the driver's (``12.535.104.05``)."""
        self._enter("nvmlSystemGetNVMLVersion")
        major = self.node.inventory.cuda_driver_version.partition(".")[0] or "12"
        return f"{major}.{self.node.inventory.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        version = self.node.inventory.cuda_driver_version
        if not version:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        major, _, minor = version.partition(".")
        return int(major) * 1000 + int(minor or 0) * 10

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()


class DeviceCalls(SimulatedLibBase):
    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.node.inventory.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        known = any(g.index == index for g in self.node.inventory.gpus)
        self._enter("nvmlDeviceGetHandleByIndex", index if known else None)
        if not known:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return self.node.handle_of(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> int:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.node.inventory.gpus:
            if gpu.uuid == wanted:
                self._enter("nvmlDeviceGetHandleByUUID", gpu.index)
                return self.node.handle_of(gpu.index)
        for index, mig_gpu in self.node.mig.gpus.items():
            for _, ci in mig_gpu.mig_devices():
                if ci.mig_uuid == wanted:
                    self._enter("nvmlDeviceGetHandleByUUID", index)
                    return ci.device_handle
        self._enter("nvmlDeviceGetHandleByUUID")
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> int:
        wanted = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
        for gpu in self.node.inventory.gpus:
            if gpu.pci_bus_id.upper().endswith(wanted.split(":", 1)[-1]) and len(wanted) >= 12:
                self._enter("nvmlDeviceGetHandleByPciBusId", gpu.index)
                return self.node.handle_of(gpu.index)
        self._enter("nvmlDeviceGetHandleByPciBusId")
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, mig = self._device("nvmlDeviceGetUUID", handle)
        if mig is not None and mig[2] is not None:
            return mig[2].mig_uuid
        return gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, mig = self._device("nvmlDeviceGetName", handle)
        return f"{gpu.product} MIG {mig[1].profile.name}" if mig is not None else gpu.product

    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo:
        gpu, _ = self._device("nvmlDeviceGetPciInfo", handle)
        return PciInfo.of(gpu.pci_bus_id)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> PciInfo:
        return self.nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Memory:
        gpu, mig = self._device("nvmlDeviceGetMemoryInfo", handle)
        total = (mig[1].profile.memory_mib if mig is not None else gpu.memory_mib) * _MIB
        return Memory(total=total, free=total, used=0)

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetArchitecture", device)
        return _ARCH_CODES.get(gpu.architecture, self.NVML_DEVICE_ARCH_UNKNOWN)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        gpu = self._gpu("nvmlDeviceGetCudaComputeCapability", handle)
        major, _, minor = gpu.compute_capability.partition(".")
        return int(major), int(minor)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        """The PCIe level two GPUs meet at (NVML ignores NVLink here), as ``nvidia-smi topo -m``."""
        a = self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        b = self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        if a.index == b.index:
            return self.NVML_TOPOLOGY_INTERNAL
        ports = switch_root_ports(self.node.inventory)
        level = pcie_class(place_of(a, ports), place_of(b, ports))
        return {
            LinkClass.PIX: self.NVML_TOPOLOGY_SINGLE,
            LinkClass.PXB: self.NVML_TOPOLOGY_MULTIPLE,
            LinkClass.PHB: self.NVML_TOPOLOGY_HOSTBRIDGE,
            LinkClass.NODE: self.NVML_TOPOLOGY_NODE,
        }.get(level, self.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        """The NUMA node *of the GPU's memory*, which exists only where the GPU is a NUMA node
        (NVML: "platforms where the GPUs are NUMA nodes", Grace-attached GPUs over NVLink-C2C);
        elsewhere NVML answers NOT_SUPPORTED, as an H200 on an x86 host did (driver 580.159.04;
        ``nvidia-smi topo -m``: "GPU NUMA ID N/A"). A GPU's NUMA *affinity* (the profile's
        ``numaNode``) is its PCI device's ``numa_node`` in sysfs, not this. Not matched: the
        profile format has no GPU memory node, so the GPUs of ``gb200-compute-tray`` answer
        NOT_SUPPORTED too, where a real GB200 names its memory's node (no GB200 recording yet)."""
        self._gpu("nvmlDeviceGetNumaNodeId", handle)
        raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetAttributes(self, device: Any) -> DeviceAttributes:
        _, mig = self._device("nvmlDeviceGetAttributes", device)
        if mig is None or mig[2] is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)  # NVML answers this for MIG devices only
        _, gi, ci = mig[0], mig[1], mig[2]
        return DeviceAttributes(
            multiprocessorCount=ci.slices * _SMS_PER_SLICE,
            sharedCopyEngineCount=gi.profile.compute_slices,
            sharedDecoderCount=0,
            sharedEncoderCount=0,
            sharedJpegCount=0,
            sharedOfaCount=0,
            gpuInstanceSliceCount=gi.profile.compute_slices,
            computeInstanceSliceCount=ci.slices,
            memorySizeMB=gi.profile.memory_mib,
        )

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> DeviceAttributes:
        return self.nvmlDeviceGetAttributes(device)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        """Fills the struct behind ``ctypes.byref`` as NVML does; NOT_SUPPORTED before Hopper."""
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfoV", device)
        if gpu.architecture not in _FABRIC_ARCHITECTURES:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)
        fabric = self.node.inventory.nvswitch
        if fabric is None or gpu.index not in fabric.gpus:
            info.state, info.status = self.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, self.NVML_SUCCESS
            return self.NVML_SUCCESS
        state = self.node.health.fabric_state
        info.state = _FABRIC_STATES[state]
        info.status = self.NVML_ERROR_UNKNOWN if state == "failed" else self.NVML_SUCCESS
        info.healthMask = _FABRIC_HEALTHY_MASK if state == "completed" else 0
        if state == "completed" and fabric.cluster_uuid:  # a multi-node NVLink domain (NVL72)
            info.clusterUuid[:] = list(uuid.UUID(fabric.cluster_uuid).bytes)
            info.cliqueId = fabric.clique_id
        return self.NVML_SUCCESS


class NvLinkCalls(SimulatedLibBase):
    """Link ``l`` of a GPU is active when the node wired it (peers first, then NVSwitches)."""

    def _link(self, call: str, device: Any, link: int) -> tuple[Gpu, str | None]:
        gpu = self._gpu(call, device)
        remotes = self.node.link_remotes[gpu.index]
        if not remotes:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        limit = max(MAX_NVLINKS.get(gpu.architecture, len(remotes)), len(remotes))
        if not 0 <= link < limit:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, remotes[link] if link < len(remotes) else None

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu, remote = self._link("nvmlDeviceGetNvLinkState", device, link)
        down = link in self.node.health.gpu(gpu.index).nvlinks_down
        return self.NVML_FEATURE_ENABLED if remote is not None and not down else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> PciInfo:
        _, remote = self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if remote is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return PciInfo.of(remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        _, remote = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if remote is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        is_gpu = any(g.pci_bus_id == remote for g in self.node.inventory.gpus)
        return self.NVML_NVLINK_DEVICE_TYPE_GPU if is_gpu else self.NVML_NVLINK_DEVICE_TYPE_SWITCH
