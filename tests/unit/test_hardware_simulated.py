"""The simulated node through the production readers: MIG devices, faults, the fake library and tree."""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from devicemodel.errors import InvalidInputError
from devicemodel.spec import NodeProfile
from hardware.backend import HardwareTimeoutError
from hardware.mig_catalog import default_catalog
from hardware.nvml import NvmlBackend
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode
from hardware.simulated.structs import NVMLError


def _with_mig_devices() -> NodeProfile:
    """dgx-a100 with GPU 1 partitioned into 3g.40gb + 2g.20gb + 1g.10gb (ids as the profile gives)."""
    document: dict[str, Any] = copy.deepcopy(load_profile("dgx-a100").to_wire())
    document["spec"]["gpus"][1]["migEnabled"] = True
    model = default_catalog().for_product("NVIDIA A100-SXM4-80GB")
    rows = [("3g.40gb", 1, 0), ("2g.20gb", 2, 4), ("1g.10gb", 5, 6)]
    document["spec"]["migDevices"] = [
        {
            "gpu": 1,
            "profile": name,
            "gpuInstanceId": gi,
            "computeInstanceId": 0,
            "placementStart": start,
            "placementSize": model.profile(name).memory_slices,
            "memoryMiB": model.profile(name).memory_mib,
            "computeSlices": model.profile(name).compute_slices,
        }
        for name, gi, start in rows
    ]
    return NodeProfile.parse(document)


@pytest.fixture
def backend(tmp_path: Path) -> Any:
    made: list[SimulatedBackend] = []

    def make(profile: NodeProfile | str, **options: Any) -> SimulatedBackend:
        chosen = load_profile(profile) if isinstance(profile, str) else profile
        made.append(SimulatedBackend(chosen, tmp_path / f"root{len(made)}", **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


def test_mig_devices_of_a_partitioned_gpu_are_discovered_exactly(backend: Any) -> None:
    profile = _with_mig_devices()
    inventory = backend(profile).discover()
    assert inventory == profile.to_inventory()
    assert [(m.profile, m.gpu_instance_id, m.placement_start) for m in inventory.mig_devices] == [
        ("3g.40gb", 1, 0),
        ("2g.20gb", 2, 4),
        ("1g.10gb", 5, 6),
    ]


def test_a_lost_gpu_is_left_out_of_discovery_and_named_as_lost(backend: Any) -> None:
    simulated = backend("p4d.24xlarge")
    simulated.node.set_gpu_lost(5)
    inventory = simulated.discover()
    assert [lost.index for lost in inventory.lost_gpus] == [5]
    assert "on GPU 5 failed: GPU is lost" in inventory.lost_gpus[0].reason
    assert 5 not in [g.index for g in inventory.gpus]
    simulated.node.set_gpu_lost(5, lost=False)
    assert simulated.discover() == simulated.inventory


def test_an_nvlink_down_at_one_end_removes_the_lane(backend: Any) -> None:
    simulated = backend("dgx1-v100")
    simulated.node.health.set_nvlink_down(0, 2)  # GPU 0's lanes: 0->1, 1->2, 2,3->3, 4,5->4
    links = {(nl.gpu_a, nl.gpu_b): nl.links for nl in simulated.discover().nvlinks}
    assert links[(0, 3)] == 1 and links[(0, 1)] == 1 and links[(0, 4)] == 2


def test_a_hung_gpu_times_out_and_discovery_recovers_after_release(backend: Any) -> None:
    simulated = backend("l40s-pcie-8", call_timeout_s=0.2)
    gate = simulated.node.hang("nvmlDeviceGetMemoryInfo", gpu=3)
    with pytest.raises(HardwareTimeoutError, match="nvmlDeviceGetMemoryInfo on GPU 3 did not return"):
        simulated.discover()
    assert gate.entered.is_set()
    with pytest.raises(HardwareTimeoutError, match="not attempted"):
        simulated.discover()
    gate.release()
    returned = threading.Event()
    for _ in range(200):
        if simulated.nvml.caller.hung_call is None:
            returned.set()
            break
        returned.wait(0.01)
    assert simulated.discover() == simulated.inventory


def test_the_fake_library_speaks_pynvml() -> None:
    node = SimulatedNode(_with_mig_devices().to_inventory())
    lib = SimulatedNvmlLib(node)
    with pytest.raises(NVMLError) as exc:
        lib.nvmlDeviceGetCount()
    assert exc.value.value == lib.NVML_ERROR_UNINITIALIZED
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(1)
    assert lib.nvmlDeviceGetPciInfo(handle).busId == node.inventory.gpu(1).pci_bus_id
    assert lib.nvmlDeviceGetCudaComputeCapability(handle) == (8, 0)
    assert lib.nvmlDeviceGetArchitecture(handle) == lib.NVML_DEVICE_ARCH_AMPERE
    assert lib.nvmlDeviceGetMigMode(handle) == [lib.NVML_DEVICE_MIG_ENABLE, lib.NVML_DEVICE_MIG_ENABLE]
    mig_uuid = node.inventory.mig_devices[0].uuid
    mig = lib.nvmlDeviceGetHandleByUUID(mig_uuid)
    assert lib.nvmlDeviceGetUUID(mig) == mig_uuid
    assert lib.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert lib.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0) == lib.NVML_NVLINK_DEVICE_TYPE_SWITCH
    with pytest.raises(NVMLError) as bad:
        lib.nvmlDeviceGetHandleByIndex(8)
    assert bad.value.value == lib.NVML_ERROR_INVALID_ARGUMENT
    lib.nvmlShutdown()


def test_fake_sysfs_has_the_kernel_layout(backend: Any, tmp_path: Path) -> None:
    simulated = backend("p5.48xlarge")
    sys_dir = simulated.sysfs_root / "sys"
    gpu0 = (sys_dir / "bus" / "pci" / "devices" / "0000:53:00.0").resolve()
    parts = gpu0.relative_to((sys_dir / "devices").resolve()).parts
    assert len(parts) == 5 and parts[-1] == "0000:53:00.0"  # bridge, root port, up, down, GPU
    assert (gpu0 / "vendor").read_text().strip() == "0x10de"
    efa = (sys_dir / "class" / "infiniband" / "rdmap79s0" / "device").resolve()
    assert efa.name == "0000:4f:00.0" and efa.parent.parent == gpu0.parent.parent  # same switch
    assert (efa / "device").read_text().strip() == "0xefa1"
    assert (sys_dir / "class" / "infiniband_verbs" / "uverbs0" / "ibdev").read_text().strip() == "rdmap79s0"
    assert not os.path.isabs(os.readlink(sys_dir / "bus" / "pci" / "devices" / "0000:53:00.0"))


def test_mig_capable_gpu_unknown_to_the_catalog_is_refused() -> None:
    document: dict[str, Any] = copy.deepcopy(load_profile("l40s-pcie-8").to_wire())
    document["spec"]["gpus"][0]["migCapable"] = True
    with pytest.raises(InvalidInputError, match="GPU 0 \\(NVIDIA L40S\\) is migCapable but the MIG catalog"):
        SimulatedNode(NodeProfile.parse(document).to_inventory())


def test_discovery_names_switches_in_bus_order_unless_told_their_names(tmp_path: Path) -> None:
    document: dict[str, Any] = copy.deepcopy(load_profile("a100-pcie-nvbridge-4").to_wire())
    renames = {"sw0": "left", "sw1": "right"}
    for switch in document["spec"]["pcieSwitches"]:
        switch["name"] = renames[switch["name"]]
    for item in document["spec"]["gpus"] + document["spec"]["nics"]:
        item["pcieSwitch"] = renames[item["pcieSwitch"]]
    profile = NodeProfile.parse(document)
    named = SimulatedBackend(profile, tmp_path / "a")
    plain = NvmlBackend(lib=named.lib, sysfs_root=named.sysfs_root, node_name=profile.name)
    try:
        assert [s.name for s in named.discover().pcie_switches] == ["left", "right"]
        assert [s.name for s in plain.discover().pcie_switches] == ["sw0", "sw1"]
        assert [g.pcie_switch for g in plain.discover().gpus] == ["sw0", "sw0", "sw1", "sw1"]
    finally:
        plain.close()
        named.close()


def _initialised_lib(profile: str) -> SimulatedNvmlLib:
    lib = SimulatedNvmlLib(SimulatedNode(load_profile(profile).to_inventory()))
    lib.nvmlInit()
    return lib


def _answer(call: Any) -> object:
    """The call's answer, or the NVML error code it raised."""
    try:
        return call()
    except NVMLError as exc:
        return f"error {exc.value}"


def test_family_answers_as_recorded_on_a_real_h200() -> None:
    """Hopper: an H200 on driver 580.159.04 (tests/fixtures/nvml) answered the NUMA node and the
    retired pages NOT_SUPPORTED and listed event types 0xFF9F; a Volta GPU still retires pages."""
    hopper, volta = (_initialised_lib(name) for name in ("h200-vm-1", "dgx1-v100"))
    not_supported = f"error {hopper.NVML_ERROR_NOT_SUPPORTED}"
    h200, v100 = hopper.nvmlDeviceGetHandleByIndex(0), volta.nvmlDeviceGetHandleByIndex(0)
    assert _answer(lambda: hopper.nvmlDeviceGetNumaNodeId(h200)) == not_supported
    assert _answer(lambda: volta.nvmlDeviceGetNumaNodeId(v100)) == not_supported  # x86: no GPU NUMA node
    assert hopper.nvmlDeviceGetSupportedEventTypes(h200) == 0xFF9F
    assert _answer(lambda: hopper.nvmlDeviceGetRetiredPagesPendingStatus(h200)) == not_supported
    assert _answer(lambda: hopper.nvmlDeviceGetRetiredPages(h200, 0)) == not_supported
    assert volta.nvmlDeviceGetRetiredPagesPendingStatus(v100) == 0
    hopper.node.health.clear()  # clearing faults keeps what the family supports
    assert _answer(lambda: hopper.nvmlDeviceGetRetiredPagesPendingStatus(h200)) == not_supported
    assert hopper.nvmlDeviceGetSupportedEventTypes(h200) == 0xFF9F


def test_h200_gpu_instance_profiles_are_the_recorded_ones() -> None:
    lib = _initialised_lib("h200-vm-1")
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    offered = {}
    for index in range(0x12):
        info = _answer(lambda index=index: lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, index))
        offered[index] = info if isinstance(info, str) else (info.id, info.sliceCount, info.memorySizeMB)
    assert offered == {
        0: (19, 1, 16384),
        1: (14, 2, 33280),
        2: (9, 3, 71424),
        3: (5, 4, 71424),
        4: (0, 7, 143360),
        7: (20, 1, 16384),
        9: (15, 1, 33280),
        **dict.fromkeys((5, 6, 8, *range(10, 17)), f"error {lib.NVML_ERROR_NOT_SUPPORTED}"),
        17: f"error {lib.NVML_ERROR_INVALID_ARGUMENT}",
    }
