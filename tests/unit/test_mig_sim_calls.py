"""The simulated pynvml MIG calls answer as pynvml does, driven the way pynvml callers drive them."""

from __future__ import annotations

import ctypes

import pytest

from hardware.profiles import load_profile
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode


@pytest.fixture
def lib() -> SimulatedNvmlLib:
    library = SimulatedNvmlLib(SimulatedNode(load_profile("dgx-h100").to_inventory()))
    library.nvmlInit()
    return library


def nvml_code(call) -> int:
    with pytest.raises(Exception) as caught:
        call()
    return int(caught.value.value)


def placement(lib: SimulatedNvmlLib, start: int, size: int):
    return ctypes.byref(lib.c_nvmlGpuInstancePlacement_t(start, size))


def test_mode_placements_and_capacity(lib):
    dev = lib.nvmlDeviceGetHandleByIndex(2)
    assert lib.nvmlDeviceGetMigMode(dev) == [0, 0]
    assert lib.nvmlDeviceGetMaxMigDeviceCount(dev) == 0
    assert lib.nvmlDeviceSetMigMode(dev, lib.NVML_DEVICE_MIG_ENABLE) == 0
    assert lib.nvmlDeviceGetMigMode(dev) == [1, 1]
    info = lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0x9)  # 1_SLICE_REV2: 1g.20gb
    assert (info.id, info.instanceCount, info.sliceCount) == (15, 4, 1)
    array = (lib.c_nvmlGpuInstancePlacement_t * info.instanceCount)()
    count = ctypes.c_uint(info.instanceCount)
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(dev, info.id, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array[: count.value]] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert (
        nvml_code(lambda: lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0x5)) == lib.NVML_ERROR_NOT_SUPPORTED
    )
    lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, placement(lib, 0, 4))
    assert lib.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 19) == 3
    assert lib.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 5) == 0
    code = nvml_code(lambda: lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 14, placement(lib, 2, 2)))
    assert code == lib.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_instances_compute_instances_and_mig_devices(lib):
    dev = lib.nvmlDeviceGetHandleByIndex(4)
    lib.nvmlDeviceSetMigMode(dev, 1)
    gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, placement(lib, 4, 4))
    gi_info = lib.nvmlGpuInstanceGetInfo(gi)
    assert (gi_info.profileId, gi_info.placement.start, gi_info.placement.size) == (9, 4, 4)
    ci_profile = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0)
    ci = lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    ci_info = lib.nvmlComputeInstanceGetInfo(ci)
    assert ci_info.profileId == ci_profile.id == 2  # NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, not 3 slices
    assert lib.nvmlDeviceGetUUID(ci_info.device) == lib.nvmlDeviceGetUUID(dev)  # the parent, as in NVML
    assert lib.nvmlDeviceGetUUID(lib.nvmlGpuInstanceGetInfo(gi).device) == lib.nvmlDeviceGetUUID(dev)
    assert nvml_code(lambda: lib.nvmlDeviceGetUUID(ci)) == lib.NVML_ERROR_INVALID_ARGUMENT
    mig_uuid = lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0))
    assert mig_uuid.startswith("MIG-")

    handles = (lib.c_nvmlGpuInstance_t * 2)()
    count = ctypes.c_uint(2)
    lib.nvmlDeviceGetGpuInstances(dev, 9, handles, ctypes.byref(count))
    assert count.value == 1 and lib.nvmlGpuInstanceGetInfo(handles[0]).id == gi_info.id

    assert lib.nvmlDeviceGetMaxMigDeviceCount(dev) == 7
    by_index = lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    assert lib.nvmlDeviceGetUUID(by_index) == mig_uuid
    assert lib.nvmlDeviceIsMigDeviceHandle(by_index).value == 1
    assert lib.nvmlDeviceIsMigDeviceHandle(dev).value == 0
    assert lib.nvmlDeviceGetGpuInstanceId(by_index) == gi_info.id
    assert lib.nvmlDeviceGetComputeInstanceId(by_index) == 0
    parent = lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(by_index)
    assert lib.nvmlDeviceGetUUID(parent) == lib.nvmlDeviceGetUUID(dev)
    assert nvml_code(lambda: lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 1)) == lib.NVML_ERROR_NOT_FOUND

    assert lib.mig_node is not None
    lib.mig_node.gpus[4].set_busy(mig_uuid)
    assert len(lib.nvmlDeviceGetComputeRunningProcesses(by_index)) == 1
    assert nvml_code(lambda: lib.nvmlComputeInstanceDestroy(ci)) == lib.NVML_ERROR_IN_USE
    assert nvml_code(lambda: lib.nvmlGpuInstanceDestroy(gi)) == lib.NVML_ERROR_IN_USE
    lib.mig_node.gpus[4].set_busy(mig_uuid, busy=False)
    lib.nvmlComputeInstanceDestroy(ci)
    lib.nvmlGpuInstanceDestroy(gi)
    assert nvml_code(lambda: lib.nvmlDeviceGetGpuInstanceById(dev, gi_info.id)) == lib.NVML_ERROR_NOT_FOUND


def test_non_mig_gpu_answers_not_supported():
    lib = SimulatedNvmlLib(SimulatedNode(load_profile("dgx1-v100").to_inventory()))
    lib.nvmlInit()
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    assert nvml_code(lambda: lib.nvmlDeviceGetMigMode(dev)) == lib.NVML_ERROR_NOT_SUPPORTED
    assert lib.nvmlDeviceGetMaxMigDeviceCount(dev) == 0
