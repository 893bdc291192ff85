"""The simulated MIG state follows NVML's documented semantics per GPU generation."""

from __future__ import annotations

import pytest

from hardware.mig_catalog import default_catalog
from hardware.simulated.mig_state import (
    NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    HandleAllocator,
    SimMigGpu,
    SimNvmlError,
)

CATALOG = default_catalog()


def gpu(key: str, *, enabled: bool = True) -> SimMigGpu:
    return SimMigGpu(
        model=CATALOG.model(key), gpu_uuid="GPU-x", handles=HandleAllocator(), mig_enabled=enabled
    )


def codes(call) -> int:
    with pytest.raises(SimNvmlError) as caught:
        call()
    return caught.value.code


def test_hopper_mode_change_is_immediate_and_lost_on_driver_reload():
    h100 = gpu("H100-80GB", enabled=False)
    assert h100.set_mode(NVML_DEVICE_MIG_ENABLE) == NVML_SUCCESS
    assert h100.mode() == (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)
    h100.create_gpu_instance(9, 0, 4)
    h100.driver_reload()
    assert h100.mode() == (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE)


def test_hopper_mode_change_refused_while_instances_or_work_exist():
    h100 = gpu("H100-80GB")
    h100.create_gpu_instance(9, 0, 4)
    assert h100.set_mode(NVML_DEVICE_MIG_DISABLE) == NVML_ERROR_IN_USE
    busy = gpu("H100-80GB", enabled=False)
    busy.set_gpu_busy(True)
    assert busy.set_mode(NVML_DEVICE_MIG_ENABLE) == NVML_ERROR_IN_USE


def test_ampere_mode_is_pending_until_reset_of_an_idle_gpu_and_survives_reload():
    a100 = gpu("A100-80GB", enabled=False)
    assert a100.set_mode(NVML_DEVICE_MIG_ENABLE) == NVML_SUCCESS
    assert a100.mode() == (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE)
    a100.set_gpu_busy(True)
    assert codes(a100.reset) == NVML_ERROR_IN_USE
    a100.set_gpu_busy(False)
    a100.reset()
    assert a100.mode() == (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)
    a100.driver_reload()
    assert a100.mig_enabled


def test_placements_capacity_and_insufficient_resources():
    h100 = gpu("H100-80GB")
    assert h100.remaining_capacity(19) == 7
    h100.create_gpu_instance(9, 0, 4)
    assert h100.remaining_capacity(19) == 3  # one 3g takes 1g from 7 to 3 (slot 7 is not a 1g start)
    assert codes(lambda: h100.create_gpu_instance(19, 2, 1)) == NVML_ERROR_INSUFFICIENT_RESOURCES
    assert codes(lambda: h100.create_gpu_instance(9, 2, 4)) == NVML_ERROR_INVALID_ARGUMENT
    assert codes(lambda: h100.profile_info(0x5)) == NVML_ERROR_NOT_SUPPORTED
    assert codes(lambda: h100.profile_info(0x12)) == NVML_ERROR_INVALID_ARGUMENT


def test_destroy_in_use_and_fresh_uuid_on_recreation():
    h100 = gpu("H100-80GB")
    gi = h100.create_gpu_instance(9, 4, 4)
    ci = h100.create_compute_instance(gi.id, 2)
    assert codes(lambda: h100.destroy_gpu_instance(gi.id)) == NVML_ERROR_IN_USE
    h100.set_busy(ci.mig_uuid)
    assert codes(lambda: h100.destroy_compute_instance(gi.id, ci.id)) == NVML_ERROR_IN_USE
    h100.set_busy(ci.mig_uuid, busy=False)
    h100.destroy_compute_instance(gi.id, ci.id)
    h100.destroy_gpu_instance(gi.id)
    again = h100.create_gpu_instance(9, 4, 4)
    assert again.id == gi.id  # GI ids are reused
    assert h100.create_compute_instance(again.id, 2).mig_uuid != ci.mig_uuid


def test_calls_need_mig_mode():
    h100 = gpu("H100-80GB", enabled=False)
    assert codes(lambda: h100.create_gpu_instance(0, 0, 8)) == NVML_ERROR_NOT_SUPPORTED
    assert h100.mig_devices() == ()
