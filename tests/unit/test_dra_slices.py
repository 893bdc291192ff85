"""DRA ResourceSlices built from the device model: names, attributes, pools, partitionable MIG, limits."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from devicemodel.inventory import NodeInventory
from dradriver.devices import MigPublishing, dra_devices, nvlink_domains
from dradriver.slices import build_resource_slices, pool_slices
from dradriver.taint import Taint
from dradriver.validate import ResourceSliceError, check_slices
from gpuweave.cli import main
from hardware.profiles import builtin_profile_names, load_profile
from hardware.simulated.backend import SimulatedBackend
from tests.support.small_inventory import gpu_uuid, small_inventory


def discovered(profile: str, node: str = "n0") -> NodeInventory:
    backend = SimulatedBackend(load_profile(profile), node_name=node)
    try:
        return backend.discover()
    finally:
        backend.close()


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def attr(device: dict[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


@pytest.mark.parametrize("profile", builtin_profile_names())
@pytest.mark.parametrize("mig", list(MigPublishing))
def test_every_builtin_profile_gives_a_valid_pool(profile: str, mig: MigPublishing) -> None:
    slices = pool_slices(discovered(profile), mig=mig)
    assert {s["spec"]["pool"]["name"] for s in slices} == {"n0"}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert all(s["spec"]["driver"] == "gpuweave.io" and s["spec"]["nodeName"] == "n0" for s in slices)
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)


def test_gpus_and_efa_under_one_switch_share_the_pcie_root_of_the_sysfs_tree() -> None:
    inventory = discovered("p5.48xlarge")
    devices = devices_of(pool_slices(inventory))
    root = "resource.kubernetes.io/pcieRoot"
    for nic in inventory.nics:
        efa = next(d for d in devices.values() if attr(d, "type") == "efa" and attr(d, "name") == nic.name)
        same_switch = [g for g in inventory.gpus if g.pcie_switch == nic.pcie_switch]
        assert same_switch, nic.name
        for gpu in same_switch:
            assert attr(devices[f"gpu-{gpu.index}"], root) == attr(efa, root) == nic.pcie_root
    roots = {attr(devices[f"gpu-{g.index}"], root) for g in inventory.gpus}
    assert len(roots) == len({g.pcie_root for g in inventory.gpus}) > 1


def test_gpu_attributes_and_capacity() -> None:
    devices = devices_of(pool_slices(discovered("dgx-h100")))
    gpu = devices["gpu-0"]
    assert attr(gpu, "type") == "gpu"
    assert attr(gpu, "productName") == "NVIDIA H100 80GB HBM3"
    assert attr(gpu, "architecture") == "hopper"
    assert attr(gpu, "computeCapability") == "9.0"
    assert attr(gpu, "cudaComputeCapability") == "9.0.0"
    assert attr(gpu, "uuid").startswith("GPU-")
    assert attr(gpu, "numaNode") == attr(gpu, "resource.kubernetes.io/numaNode") == 0
    assert attr(gpu, "pcieSwitch") == "sw0"
    assert attr(gpu, "nvlinkDomain") == "nvl0" and attr(gpu, "nvlinkPeers") == 7
    assert gpu["capacity"]["memory"] == {"value": "81559Mi"}
    assert {attr(d, "nvlinkDomain") for d in devices.values()} == {"nvl0"}


def test_nvlink_domains_are_connected_components_and_pcie_gpus_have_none() -> None:
    assert nvlink_domains(discovered("l40s-pcie-8")) == {}
    pairs = nvlink_domains(small_inventory())  # NVLink pairs 0-1 and 2-3
    assert pairs[0][0] == pairs[1][0] != pairs[2][0] == pairs[3][0]
    assert "nvlinkDomain" not in devices_of(pool_slices(discovered("l40s-pcie-8")))["gpu-0"]["attributes"]


def test_static_mig_publishes_existing_mig_devices_in_place_of_their_gpu() -> None:
    inventory = small_inventory(mig_on=(1,))
    devices = devices_of(pool_slices(inventory))
    assert "gpu-1" not in devices and "gpu-0" in devices
    migs = [d for d in devices.values() if attr(d, "type") == "mig"]
    assert [attr(d, "profile") for d in migs] == ["3g.40gb", "3g.40gb"]
    assert {attr(d, "parentUUID") for d in migs} == {gpu_uuid(1)}
    assert all(attr(d, "uuid").startswith("MIG-") for d in migs)
    assert not any("consumesCounters" in d for d in devices.values())


def test_dynamic_mig_publishes_counters_whole_gpu_and_every_placement() -> None:
    inventory = discovered("dgx-h100")
    slices = pool_slices(inventory, mig=MigPublishing.DYNAMIC)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counter_slices) == 1 and len(counter_slices[0]["spec"]["sharedCounters"]) == 8
    sets = {c["name"]: c["counters"] for c in counter_slices[0]["spec"]["sharedCounters"]}
    assert sets["gpu-0-mig"]["compute-slices"] == {"value": "7"}
    assert {f"memory-slice-{i}" for i in range(8)} <= set(sets["gpu-0-mig"])
    devices = devices_of(slices)
    whole = devices["gpu-0"]["consumesCounters"][0]
    assert whole["counterSet"] == "gpu-0-mig" and set(whole["counters"]) == set(sets["gpu-0-mig"])
    half = devices["gpu-0-mig-3g-40gb-4"]["consumesCounters"][0]["counters"]
    assert half == {
        **{f"memory-slice-{i}": {"value": "1"} for i in range(4, 8)},
        "compute-slices": {"value": "3"},
    }
    assert "media-extensions" in devices["gpu-0-mig-1g-10gb-me-0"]["consumesCounters"][0]["counters"]
    per_gpu = [n for n in devices if n.startswith("gpu-0-mig-")]
    assert len(per_gpu) == 7 + 7 + 4 + 3 + 2 + 1 + 1  # every placement of every H100 profile
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in slices)


def test_dynamic_mig_leaves_gpus_without_mig_as_plain_devices() -> None:
    devices = devices_of(pool_slices(discovered("dgx1-v100"), mig=MigPublishing.DYNAMIC))
    assert all("consumesCounters" not in d for d in devices.values())
    assert len(devices) == 8


def test_taints_are_published_and_generation_is_the_pools() -> None:
    inventory = small_inventory()
    devices = dra_devices(inventory)
    taint = Taint("gpuweave.io/unhealthy", "failed", "NoExecute")
    slices = build_resource_slices(inventory, devices, generation=7, taints={"gpu-2": (taint,)})
    check_slices(slices)
    assert devices_of(slices)["gpu-2"]["taints"] == [taint.to_wire()]
    assert "taints" not in devices_of(slices)["gpu-1"]
    assert slices[0]["spec"]["pool"]["generation"] == 7


def test_a_node_without_devices_publishes_one_empty_slice() -> None:
    empty = NodeInventory(name="cpu-node", numa_nodes=1, gpus=())
    (only,) = pool_slices(empty)
    assert only["spec"]["devices"] == [] and only["spec"]["pool"]["resourceSliceCount"] == 1


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda d: d["spec"]["devices"][0].update(name="GPU_0"), "not a DNS label"),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update({f"a{i}": {"int": i} for i in range(40)}),
            "32",
        ),
        (lambda d: d["spec"]["devices"][0]["attributes"].update(long={"string": "x" * 65}), "65 characters"),
        (lambda d: d["spec"]["devices"].append(copy.deepcopy(d["spec"]["devices"][0])), "twice"),
        (
            lambda d: d["spec"]["devices"][0].update(taints=[{"key": "k", "effect": "PreferNoSchedule"}]),
            "effect",
        ),
        (lambda d: d["spec"]["pool"].update(resourceSliceCount=2), "resourceSliceCount"),
    ],
)
def test_check_slices_names_the_limit_broken(break_it: Any, message: str) -> None:
    (item,) = pool_slices(small_inventory())
    break_it(item)
    with pytest.raises(ResourceSliceError, match=message):
        check_slices([item])


def test_publish_dra_prints_one_yaml_document_per_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["publish", "--simulate", "dgx-h100", "--node-name", "n0", "--dra", "--dra-mig", "dynamic"]) == 0
    )
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ResourceSlice"] * 5
    assert all(d["apiVersion"] == "resource.k8s.io/v1" for d in docs)


def test_publish_without_dra_still_prints_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", "--simulate", "dgx-h100", "--node-name", "n0"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "List"
