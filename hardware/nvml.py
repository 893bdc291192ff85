"""The NVML backend: GPUs, MIG devices and NVLink from the driver, the rest from sysfs.

This is the only module that imports pynvml, and only when no library object is injected: the
simulated backend passes its fake library, so these readers run unchanged in tests. Every call
goes through ``NvmlCaller`` (deadline + error mapping); ``caller`` and ``lib`` are public so the
MIG manager and health checks make their NVML calls the same way.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devicemodel.inventory import Architecture, NodeInventory
from devicemodel.spec_derive import normalize_bus_id
from hardware.backend import (
    DriverNotLoadedError,
    HardwareError,
    HardwareTimeoutError,
    NotFoundError,
    NotSupportedError,
)
from hardware.discovery import GpuFacts, MigFacts, assemble_inventory
from hardware.fabric import fabric_domain
from hardware.gpu_identity import GpuIdentities
from hardware.nvml_call import DEFAULT_CALL_TIMEOUT_S, NvmlCaller, is_code
from hardware.sysfs import SysfsReader, sysfs_bdf

LOG = logging.getLogger(__name__)
_ARCHITECTURES = (
    "KEPLER",
    "MAXWELL",
    "PASCAL",
    "VOLTA",
    "TURING",
    "AMPERE",
    "ADA",
    "HOPPER",
    "BLACKWELL",
)
_MIB = 1024 * 1024


def load_pynvml() -> Any:
    """The real pynvml module (package nvidia-ml-py)."""
    try:
        import pynvml  # noqa: PLC0415 - the one place gpuweave imports it, only when needed
    except ImportError as exc:
        raise DriverNotLoadedError(
            f"cannot import pynvml ({exc}); install the nvidia-ml-py package"
        ) from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Discovers the node through NVML (``lib``: pynvml or a look-alike) and sysfs below ``sysfs_root``."""

    def __init__(
        self,
        lib: Any | None = None,
        *,
        sysfs_root: Path | str = Path("/"),
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        node_name: str | None = None,
        switch_names: Mapping[str, str] | None = None,
        identity_file: Path | None = None,
        root_port_names: Mapping[str, str | None] | None = None,
    ) -> None:
        self.lib = lib if lib is not None else load_pynvml()
        self.identities = GpuIdentities(identity_file)
        self.caller = NvmlCaller(self.lib, timeout_s=call_timeout_s)
        self.sysfs = SysfsReader(sysfs_root)
        self.node_name = node_name or platform.node() or "localhost"
        self._switch_names = dict(switch_names or {})
        self._root_port_names = dict(root_port_names or {})
        self._initialized = False

    def discover(self) -> NodeInventory:
        self.ensure_initialized()
        count = int(self.caller.invoke("nvmlDeviceGetCount"))
        gpus: list[GpuFacts] = []
        lost: list[tuple[int, str]] = []
        for index in range(count):
            try:
                gpus.append(self._read_gpu_and_links(index))
            except (HardwareTimeoutError, DriverNotLoadedError):
                raise  # the driver as a whole, not one GPU: keep the lists we have
            except HardwareError as exc:
                if is_code(exc, self.lib, "NVML_ERROR_UNINITIALIZED"):
                    raise  # our session was closed under us (a reset): no GPU's fault
                LOG.warning("GPU %d does not answer (%s); serving the other GPUs without it", index, exc)
                lost.append((index, str(exc)))
        self.identities.remember(gpus)
        return assemble_inventory(
            node_name=self.node_name,
            gpus=gpus,
            lost_gpus=self.identities.name_lost(lost, reached=gpus, sysfs=self.sysfs),
            sysfs=self.sysfs,
            switch_names=self._switch_names,
            root_port_names=self._root_port_names,
            driver_version=_text(self.caller.invoke("nvmlSystemGetDriverVersion")),
            cuda_driver_version=self._cuda_version(),
        )

    def ensure_initialized(self) -> None:
        if not self._initialized:
            self.caller.invoke("nvmlInit")
            self._initialized = True

    def handle(self, index: int) -> Any:
        return self.caller.invoke("nvmlDeviceGetHandleByIndex", index, target=f"GPU {index}")

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self.caller.invoke("nvmlShutdown")
            except HardwareError as exc:
                LOG.warning("nvmlShutdown failed: %s", exc)
        self.caller.close()

    # -- per GPU -------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any, index: int) -> Any:
        return self.caller.invoke(name, *args, target=f"GPU {index}")

    def _optional(self, name: str, *args: Any, index: int) -> Any | None:
        """A call some GPUs or drivers lack: None when not supported."""
        try:
            return self._call(name, *args, index=index)
        except NotSupportedError:
            return None

    def _read_gpu_and_links(self, index: int) -> GpuFacts:
        """One GPU's facts and NVLink wiring; any error is this GPU's alone (the caller decides)."""
        gpu = self._read_gpu(index)
        self._read_nvlinks(gpu)
        if gpu.link_remotes:
            gpu.fabric_domain = self._read_fabric_domain(gpu.index)
        return gpu

    def _read_gpu(self, index: int) -> GpuFacts:
        handle = self.handle(index)
        bus_id = normalize_bus_id(_text(self._call("nvmlDeviceGetPciInfo", handle, index=index).busId))
        capability = self._optional("nvmlDeviceGetCudaComputeCapability", handle, index=index)
        mig_mode = self._optional("nvmlDeviceGetMigMode", handle, index=index)
        mig_enabled = mig_mode is not None and mig_mode[0] == self.lib.NVML_DEVICE_MIG_ENABLE
        return GpuFacts(
            index=index,
            uuid=_text(self._call("nvmlDeviceGetUUID", handle, index=index)),
            pci_bus_id=bus_id,
            product=_text(self._call("nvmlDeviceGetName", handle, index=index)),
            architecture=self._architecture(handle, index),
            compute_capability=f"{capability[0]}.{capability[1]}" if capability else "",
            memory_mib=int(self._call("nvmlDeviceGetMemoryInfo", handle, index=index).total) // _MIB,
            minor=int(self._call("nvmlDeviceGetMinorNumber", handle, index=index)),
            numa_node=self._numa_node(handle, index, bus_id),
            mig_capable=mig_mode is not None,
            mig_enabled=mig_enabled,
            mig_devices=tuple(self._read_mig_devices(handle, index)) if mig_enabled else (),
        )

    def _architecture(self, handle: Any, index: int) -> Architecture:
        value = self._optional("nvmlDeviceGetArchitecture", handle, index=index)
        for name in _ARCHITECTURES:
            if value is not None and value == getattr(self.lib, f"NVML_DEVICE_ARCH_{name}", None):
                return Architecture(name.lower())
        return Architecture.UNKNOWN

    def _numa_node(self, handle: Any, index: int, bus_id: str) -> int:
        device = self.sysfs.pci_device(sysfs_bdf(bus_id))
        if device is not None and device.numa_node >= 0:
            return device.numa_node
        node = self._optional("nvmlDeviceGetNumaNodeId", handle, index=index)
        return int(node) if node is not None and int(node) >= 0 else 0

    def _read_mig_devices(self, handle: Any, index: int) -> list[MigFacts]:
        found: list[MigFacts] = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle, index=index))):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, index=index)
            except (NotFoundError, NotSupportedError):
                continue
            found.append(self._read_mig_device(handle, mig, index))
        return found

    def _read_mig_device(self, handle: Any, mig: Any, index: int) -> MigFacts:
        gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig, index=index))
        attributes = self._call("nvmlDeviceGetAttributes", mig, index=index)
        instance = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id, index=index)
        placement = self._call("nvmlGpuInstanceGetInfo", instance, index=index).placement
        name = _text(self._call("nvmlDeviceGetName", mig, index=index))
        memory_mib = int(attributes.memorySizeMB)
        slices = int(attributes.computeInstanceSliceCount)
        _, marker, profile = name.rpartition(" MIG ")  # "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
        if not marker:
            profile = f"{int(attributes.gpuInstanceSliceCount)}g.{round(memory_mib / 1024)}gb"
        return MigFacts(
            uuid=_text(self._call("nvmlDeviceGetUUID", mig, index=index)),
            profile=profile,
            gpu_instance_id=gi_id,
            compute_instance_id=int(self._call("nvmlDeviceGetComputeInstanceId", mig, index=index)),
            placement_start=int(placement.start),
            placement_size=int(placement.size),
            memory_mib=memory_mib,
            compute_slices=slices,
        )

    # -- NVLink --------------------------------------------------------------------------------

    def _read_nvlinks(self, gpu: GpuFacts) -> None:
        """Fill the GPU's active links: remote PCI bus id per active link."""
        handle = self.handle(gpu.index)
        for link in range(int(getattr(self.lib, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", handle, link, index=gpu.index)
            except NotSupportedError:
                break  # no NVLink on this GPU
            except HardwareError as exc:
                if is_code(exc, self.lib, "NVML_ERROR_INVALID_ARGUMENT"):
                    break  # past the GPU's last link
                raise
            if state != self.lib.NVML_FEATURE_ENABLED:
                continue
            remote = self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, index=gpu.index)
            gpu.link_remotes.append(normalize_bus_id(_text(remote.busId)))

    def _read_fabric_domain(self, index: int) -> tuple[str, int] | None:
        """The GPU's multi-node NVLink domain from its fabric info (Hopper and later), else None."""
        struct = getattr(self.lib, "c_nvmlGpuFabricInfoV_t", None)
        if struct is None:
            return None
        info = struct()
        handle = self.handle(index)
        if self._optional("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info), index=index) is None:
            return None
        return fabric_domain(info)

    def _cuda_version(self) -> str:
        try:
            version = int(self.caller.invoke("nvmlSystemGetCudaDriverVersion"))
        except NotSupportedError:
            return ""
        return f"{version // 1000}.{(version % 1000) // 10}"
