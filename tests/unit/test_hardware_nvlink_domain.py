"""Multi-node NVLink domains (GB200/GB300 NVL72): from the fabric's answer to what the node publishes.

The production path runs unchanged over the simulated NVML: discovery reads each NVSwitch GPU's
``nvmlDeviceGetGpuFabricInfoV`` (cluster UUID and clique ID of a completed fabric), the inventory
keeps the domain when every switch-attached GPU names the same one, and the agent publishes it as
GFD's ``nvidia.com/gpu.clique`` label, as DRA attributes and in its inventory resource.
"""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

import pytest

from devicemodel.spec import NodeProfile, ProfileError
from dradriver.devices import dra_devices
from hardware.discovery import GpuFacts, _domain
from hardware.fabric import FabricReader, FabricState, fabric_domain
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.published import inventory_object, node_labels
from topology.network import LABEL_GPU_CLIQUE

TRAY = "gb200-compute-tray"
CLUSTER = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"


def tray(cluster: str | None = CLUSTER, clique: int | None = 7, *, state: str | None = None) -> NodeProfile:
    document: dict[str, Any] = load_profile(TRAY).to_wire()
    fabric = document["spec"]["nvswitch"]
    for key, value in (("clusterUuid", cluster), ("cliqueId", clique), ("fabricState", state)):
        fabric.pop(key, None)
        if value is not None:
            fabric[key] = value
    return NodeProfile.parse(document)


def discover(profile: NodeProfile) -> Any:
    backend = SimulatedBackend(profile)
    try:
        return backend.discover()
    finally:
        backend.close()


def test_discovery_reads_the_domain_from_nvml_and_the_node_publishes_it() -> None:
    inventory = discover(tray())
    assert inventory.nvswitch is not None
    assert (inventory.nvswitch.cluster_uuid, inventory.nvswitch.clique_id) == (CLUSTER, 7)
    assert node_labels(inventory)[LABEL_GPU_CLIQUE] == f"{CLUSTER}.7"
    spec = inventory_object(inventory)["spec"]["nvswitch"]
    assert (spec["clusterUuid"], spec["cliqueId"]) == (CLUSTER, 7)
    gpus = [d for d in dra_devices(inventory) if d.gpu_uuid and d.name.startswith("gpu-")]
    assert len(gpus) == 4
    assert {d.attributes["clique"]["string"] for d in gpus} == {f"{CLUSTER}.7"}
    assert {d.attributes["cliqueID"]["int"] for d in gpus} == {7}


@pytest.mark.parametrize("state", ["not-started", "in-progress", "failed"])
def test_a_fabric_not_completed_names_no_domain(state: str) -> None:
    inventory = discover(tray(state=state))
    assert inventory.nvswitch is not None and inventory.nvswitch.clique is None
    assert LABEL_GPU_CLIQUE not in node_labels(inventory)


def test_a_single_node_board_has_no_clique_label() -> None:
    for profile in ("dgx-h100", "p5.48xlarge"):
        inventory = discover(load_profile(profile))
        assert inventory.nvswitch is not None and inventory.nvswitch.clique is None
        assert LABEL_GPU_CLIQUE not in node_labels(inventory)
        assert all("clique" not in d.attributes for d in dra_devices(inventory))


def test_an_all_zero_cluster_in_a_profile_is_no_domain() -> None:
    inventory = tray(cluster=str(uuid.UUID(int=0)), clique=3).spec.to_inventory(node_name="n")
    assert inventory.nvswitch is not None and inventory.nvswitch.clique is None


def test_a_profile_cluster_uuid_must_be_a_lower_case_uuid() -> None:
    with pytest.raises(ProfileError, match="clusterUuid"):
        tray(cluster="not-a-uuid")


def _facts(index: int, domain: tuple[str, int] | None) -> GpuFacts:
    return GpuFacts(
        index=index,
        uuid=f"GPU-{index}",
        pci_bus_id=f"00000000:0{index}:00.0",
        product="NVIDIA GB200",
        architecture=load_profile(TRAY).spec.to_inventory(node_name="n").gpus[0].architecture,
        compute_capability="10.0",
        memory_mib=1,
        minor=index,
        numa_node=0,
        mig_capable=False,
        mig_enabled=False,
        fabric_domain=domain,
    )


def test_gpus_that_disagree_or_lack_a_domain_publish_none() -> None:
    same = [_facts(i, (CLUSTER, 2)) for i in range(4)]
    assert _domain(same) == (CLUSTER, 2)
    assert _domain([*same[:3], _facts(3, (CLUSTER, 3))]) == ("", 0)
    assert _domain([*same[:3], _facts(3, None)]) == ("", 0)


def test_fabric_reader_keeps_the_domain_and_state_zero_takes_the_fabric_manager_check() -> None:
    backend = SimulatedBackend(tray())
    try:
        report = FabricReader(backend.nvml.caller, host_root=backend.sysfs_root).read(backend.discover())
    finally:
        backend.close()
    assert {g.clique for g in report.gpus} == {f"{CLUSTER}.7"}
    assert {g.state for g in report.gpus} == {FabricState.COMPLETED}

    class Info(ctypes.Structure):
        _fields_ = (
            ("clusterUuid", ctypes.c_uint8 * 16),
            ("status", ctypes.c_uint),
            ("cliqueId", ctypes.c_uint32),
            ("state", ctypes.c_uint),
            ("healthMask", ctypes.c_uint32),
        )

    unsupported = Info(state=0)  # what a one-GPU H200 VM answered (driver 580.159.04)
    assert fabric_domain(unsupported) is None
    completed = Info(state=3, cliqueId=5)
    completed.clusterUuid[:] = list(uuid.UUID(CLUSTER).bytes)
    assert fabric_domain(completed) == (CLUSTER, 5)
    completed.status = 999
    assert fabric_domain(completed) is None
