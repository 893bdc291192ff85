"""MIG device identity: a MIG device is named by its own UUID, read through NVML's MIG-device handles.

NVML's ``nvmlComputeInstanceGetInfo(ci).device`` (and ``nvmlGpuInstanceGetInfo(gi).device``) is the
*parent* GPU (nvml.h: "Parent device"). Code that took it for the MIG device named every MIG device
with the GPU's UUID, so a busy instance looked idle to a reshape. On NVML this suite only reads
the MIG devices that exist; on the simulator it first creates two (MIG mode on, two instances).
"""

from __future__ import annotations

import ctypes
from typing import Any

from devicemodel.inventory import NodeInventory
from hardware.backend import HardwareError
from hardware.mig_catalog import default_catalog
from hardware.mig_ops import COMPUTE_INSTANCE_PROFILE_COUNT, MigOps
from hardware.nvml_call import NvmlCaller
from tests.contract.conftest import BackendUnderTest

_CREATED = ((3, 0), (2, 4))  # (compute slices, placement start) of the two simulated instances


def _create_two_mig_devices(under_test: BackendUnderTest, ops: MigOps, inventory: NodeInventory) -> bool:
    """Simulator only: MIG on for the first MIG-capable GPU and two instances; False without one."""
    node = under_test.node
    assert node is not None
    capable = [g for g in inventory.gpus if g.mig_capable]
    if not capable:
        return False
    gpu = capable[0]
    ops.set_mig_mode(gpu.index, enabled=True)
    node.mig.reset(gpu.pci_bus_id)  # Ampere applies a pending mode at reset; Hopper already has
    model = default_catalog().for_product(gpu.product)
    for slices, start in _CREATED:
        profile = next(p for p in model.profiles if p.compute_slices == slices and "+" not in p.name)
        ops.create(
            gpu.index,
            profile_id=profile.profile_id,
            start=start,
            size=profile.memory_slices,
            ci_profile_index=profile.ci_profile_index,
        )
    return True


def _compute_instance_handles(caller: NvmlCaller, lib: Any, gi: Any) -> list[Any]:
    """Every compute-instance handle of a GPU instance, over the CI profiles it offers."""
    handles: list[Any] = []
    for ci_index in range(COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            profile = caller.invoke("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, ci_index, 0)
        except HardwareError:  # profiles this GPU instance does not offer
            continue
        capacity = max(1, int(profile.instanceCount))
        array = (lib.c_nvmlComputeInstance_t * capacity)()
        count = ctypes.c_uint(capacity)
        caller.invoke("nvmlGpuInstanceGetComputeInstances", gi, profile.id, array, ctypes.byref(count))
        handles.extend(array[: count.value])
    return handles


def test_mig_devices_are_named_by_their_own_uuids(under_test: BackendUnderTest) -> None:
    caller, lib = under_test.caller, under_test.lib
    inventory = under_test.backend.discover()
    ops = MigOps(lib, call=caller)
    if under_test.node is not None and _create_two_mig_devices(under_test, ops, inventory):
        inventory = under_test.backend.discover()
        assert len(inventory.mig_devices) == len(_CREATED)
    for gpu in (g for g in inventory.gpus if g.mig_enabled):
        migs = inventory.mig_devices_of(gpu.index)
        expected = {(m.gpu_instance_id, m.compute_instance_id): m.uuid for m in migs}
        assert ops.mig_uuids(gpu.index) == expected
        records = ops.instances(gpu.index)
        assert {(r.gi_id, c.ci_id): c.mig_uuid for r in records for c in r.computes} == expected
        assert gpu.uuid not in expected.values()


def test_instance_info_device_is_the_parent_gpu(under_test: BackendUnderTest) -> None:
    caller, lib = under_test.caller, under_test.lib
    inventory = under_test.backend.discover()
    ops = MigOps(lib, call=caller)
    if under_test.node is not None and _create_two_mig_devices(under_test, ops, inventory):
        inventory = under_test.backend.discover()
    for gpu in (g for g in inventory.gpus if g.mig_enabled):
        handle = caller.invoke("nvmlDeviceGetHandleByIndex", gpu.index)
        for gi_id in {m.gpu_instance_id for m in inventory.mig_devices_of(gpu.index)}:
            gi = caller.invoke("nvmlDeviceGetGpuInstanceById", handle, gi_id)
            parent = caller.invoke("nvmlGpuInstanceGetInfo", gi).device
            assert caller.invoke("nvmlDeviceGetUUID", parent) == gpu.uuid
            for ci in _compute_instance_handles(caller, lib, gi):
                info = caller.invoke("nvmlComputeInstanceGetInfo", ci)
                assert caller.invoke("nvmlDeviceGetUUID", info.device) == gpu.uuid
