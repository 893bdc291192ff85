"""What every hardware backend guarantees, checked the same way on the simulator and on NVML."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from devicemodel.inventory import NodeInventory
from hardware.backend import GpuBackend, HardwareError, HardwareTimeoutError, NotSupportedError
from hardware.nvml_call import NvmlCaller
from tests.contract.conftest import BackendUnderTest


def _check_well_formed(inventory: NodeInventory) -> None:
    indexes = [g.index for g in inventory.gpus]
    assert indexes == list(range(len(indexes))), "GPU indexes are 0..n-1 in order"
    uuids = [g.uuid for g in inventory.gpus]
    assert len(set(uuids)) == len(uuids) and all(u.startswith("GPU-") for u in uuids)
    bus_ids = [g.pci_bus_id for g in inventory.gpus] + [n.pci_bus_id for n in inventory.nics]
    assert len(set(bus_ids)) == len(bus_ids)
    switches = {s.name: s for s in inventory.pcie_switches}
    for item in (*inventory.gpus, *inventory.nics):
        assert 0 <= item.numa_node < inventory.numa_nodes
        if item.pcie_switch is not None:
            assert item.pcie_switch in switches
            assert switches[item.pcie_switch].root == item.pcie_root
    assert all(0 <= s.numa_node < inventory.numa_nodes for s in switches.values())
    minors = [g.minor for g in inventory.gpus]
    assert len(set(minors)) == len(minors)


def test_discovery_is_well_formed_and_repeatable(under_test: BackendUnderTest) -> None:
    assert isinstance(under_test.backend, GpuBackend)
    first = under_test.backend.discover()
    _check_well_formed(first)
    assert under_test.backend.discover() == first


def test_discovery_equals_the_profile(under_test: BackendUnderTest) -> None:
    if under_test.expected is None:  # real hardware: no profile to compare with
        assert under_test.name == "nvml"
        return
    assert under_test.backend.discover() == under_test.expected


def test_nvlink_pairs_are_symmetric_at_the_driver_and_in_the_inventory(under_test: BackendUnderTest) -> None:
    inventory = under_test.backend.discover()
    pairs = [(link.gpu_a, link.gpu_b) for link in inventory.nvlinks]
    assert all(a < b for a, b in pairs) and len(set(pairs)) == len(pairs)
    by_bus = {g.pci_bus_id: g.index for g in inventory.gpus}
    seen: Counter[tuple[int, int]] = Counter()
    for gpu in inventory.gpus:
        for remote in _active_link_remotes(under_test, gpu.index):
            if remote in by_bus:
                seen[(gpu.index, by_bus[remote])] += 1
    assert all(seen[(a, b)] == seen[(b, a)] for a, b in seen)
    assert {(link.gpu_a, link.gpu_b): link.links for link in inventory.nvlinks} == {
        (a, b): n for (a, b), n in seen.items() if a < b
    }
    if inventory.nvswitch is not None:
        assert set(inventory.nvswitch.gpus) <= {g.index for g in inventory.gpus}


def _active_link_remotes(under_test: BackendUnderTest, index: int) -> list[str]:
    caller, lib = under_test.caller, under_test.lib
    handle = caller.invoke("nvmlDeviceGetHandleByIndex", index)
    remotes = []
    for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS"))):  # noqa: B009 - the lib's constant
        try:
            state = caller.invoke("nvmlDeviceGetNvLinkState", handle, link)
        except HardwareError:
            break
        if state == getattr(lib, "NVML_FEATURE_ENABLED"):  # noqa: B009
            info = caller.invoke("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            remotes.append(str(info.busId).upper())
    return remotes


def test_mig_devices_sit_on_mig_enabled_gpus(under_test: BackendUnderTest) -> None:
    inventory = under_test.backend.discover()
    for mig in inventory.mig_devices:
        parent = inventory.gpu(mig.parent_index)
        assert parent.mig_enabled and parent.mig_capable and mig.parent_uuid == parent.uuid
        assert mig.uuid.startswith("MIG-")
    assert all(g.mig_capable for g in inventory.gpus if g.mig_enabled)


def test_driver_errors_surface_as_our_types(under_test: BackendUnderTest) -> None:
    under_test.backend.discover()  # initializes the library
    caller = under_test.caller
    count = int(caller.invoke("nvmlDeviceGetCount"))
    with pytest.raises(HardwareError) as exc:
        caller.invoke("nvmlDeviceGetHandleByIndex", count + 3)
    assert not isinstance(exc.value, getattr(under_test.lib, "NVMLError"))  # noqa: B009
    assert exc.value.code == getattr(under_test.lib, "NVML_ERROR_INVALID_ARGUMENT")  # noqa: B009
    assert "nvmlDeviceGetHandleByIndex" in str(exc.value)
    with pytest.raises(NotSupportedError, match="nvmlNoSuchCall"):
        caller.invoke("nvmlNoSuchCall")


def test_a_hung_call_fails_closed_and_later_calls_fail_fast(under_test: BackendUnderTest) -> None:
    under_test.backend.discover()
    caller = NvmlCaller(under_test.lib, timeout_s=0.2)
    release = threading.Event()
    try:
        if under_test.node is not None:  # hang the simulated driver itself
            gate = under_test.node.hang("nvmlDeviceGetCount")
            release_hang = gate.release
        else:  # on real hardware, stand in for the hung driver with a blocking call
            release_hang = release.set
        with pytest.raises(HardwareTimeoutError, match=r"nvmlDeviceGetCount did not return within 0\.2s"):
            if under_test.node is not None:
                caller.invoke("nvmlDeviceGetCount")
            else:
                caller("nvmlDeviceGetCount", release.wait)
        with pytest.raises(HardwareTimeoutError, match="nvmlSystemGetDriverVersion not attempted"):
            caller.invoke("nvmlSystemGetDriverVersion")
        assert caller.hung_call == "nvmlDeviceGetCount"
    finally:
        release_hang()
    caller.close()  # the worker finishes the stuck call, then stops
