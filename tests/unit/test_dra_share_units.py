"""A fractional GPU's units as DRA devices, for pod specs that ask gpuweave.io/gpu-compute or
gpu-memory through a DeviceClass's extendedResourceName: published with the GPU's share counters,
one GPU's units open at a time, and prepared with Allocate's edits per request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from dradriver.claim_cdi import ClaimSpecWriter
from dradriver.devices import DraDevice, dra_devices
from dradriver.prepare import ClaimError, ClaimPreparer, ClaimRef
from dradriver.share_units import CLOSED_TAINT, closed_unit_taints, open_gpu
from dradriver.shares import ShareEdits, with_shares
from dradriver.slices import pool_slices
from dradriver.taints import DeviceCondition, device_taints
from hardware.device_nodes import CharDevice, HostDeviceNodes
from health.policy import DeviceState
from tests.support.small_inventory import gpu_uuid, small_inventory

REPO = Path(__file__).parents[2]
HOST = HostDeviceNodes(control=(CharDevice("/dev/nvidiactl", 195, 255),))
PLAN = SharingPlan(per_gpu={"2": GpuSharing(SharingMode.FRACTIONAL), "3": GpuSharing(SharingMode.FRACTIONAL)})
INVENTORY = small_inventory()
POOL: tuple[DraDevice, ...] = with_shares(dra_devices(INVENTORY), INVENTORY, PLAN)


def pipe_of(uuid: str) -> str:
    return f"/run/gpuweave/mps/{uuid}/pipe"


def test_a_fractional_gpu_publishes_its_units_on_its_share_counters() -> None:
    slices = pool_slices(INVENTORY, sharing=PLAN)
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    counter_sets = {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters", [])}
    assert counter_sets == {
        f"gpu-{i}-share": {"compute": {"value": "100"}, "memory": {"value": "80"}} for i in (2, 3)
    }
    for i in (2, 3):
        compute = [n for n in devices if n.startswith(f"gpu-{i}-compute-")]
        memory = [n for n in devices if n.startswith(f"gpu-{i}-memory-")]
        assert (len(compute), len(memory)) == (100, 80)
    unit = devices["gpu-2-compute-7"]
    assert unit["attributes"]["type"] == {"string": "gpu-compute"}
    assert unit["consumesCounters"] == [
        {"counterSet": "gpu-2-share", "counters": {"compute": {"value": "1"}}}
    ]
    assert devices["gpu-2-memory-0"]["consumesCounters"][0]["counters"] == {"memory": {"value": "1"}}
    # the shared device takes all of the GPU's counters: one share keeps units off, and the reverse
    assert devices["gpu-2-share"]["consumesCounters"] == [
        {"counterSet": "gpu-2-share", "counters": {"compute": {"value": "100"}, "memory": {"value": "80"}}}
    ]
    assert not [n for n in devices if n.startswith(("gpu-0-compute", "gpu-1-memory"))]


def test_one_gpus_units_are_open_the_one_with_most_free_units() -> None:
    assert open_gpu(POOL, held=(), tainted=()) == 2  # equal: the lowest index
    taints = closed_unit_taints(POOL, held=(), tainted=())
    assert taints["gpu-3-compute-0"] == (CLOSED_TAINT,) and "gpu-2-compute-0" not in taints
    assert CLOSED_TAINT.effect == "NoSchedule"
    held = {f"gpu-2-compute-{k}" for k in range(30)}
    assert open_gpu(POOL, held=held, tainted=()) == 3  # 70 free on GPU 2, 100 on GPU 3
    assert open_gpu(POOL, held={"gpu-3-share"}, tainted=()) == 2  # a GPU with shares takes no units
    assert open_gpu(POOL, held={"gpu-3-share"}, tainted={"gpu-2-share"}) is None  # GPU 2 unhealthy
    assert all(n.startswith(("gpu-2-", "gpu-3-")) for n in closed_unit_taints(POOL, held=(), tainted=()))


class Claims:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def add(self, uid: str, results: list[tuple[str, str]]) -> ClaimRef:
        wire = [{"request": r, "driver": "gpuweave.io", "pool": "node-a", "device": d} for r, d in results]
        self.claims[uid] = {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": wire}}},
        }
        return ClaimRef(uid, "ns", f"claim-{uid}")

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[name.removeprefix("claim-")]


def preparer(tmp_path: Path, claims: Claims) -> ClaimPreparer:
    return ClaimPreparer(
        pool="node-a",
        state_dir=tmp_path,
        source=claims,
        devices=lambda: (INVENTORY, POOL),
        specs=ClaimSpecWriter(tmp_path / "cdi"),
        host=lambda: HOST,
        share_edits=ShareEdits(sharing=lambda: (INVENTORY, PLAN), pipes=lambda: pipe_of),
    )


def test_an_extended_resource_claim_gets_allocates_edits_per_request(tmp_path: Path) -> None:
    claims = Claims()
    compute = [("container-0-request-0", f"gpu-2-compute-{k}") for k in range(30)]
    memory = [("container-0-request-1", f"gpu-2-memory-{k}") for k in range(10)]
    ref = claims.add("u1", compute + memory)
    changed: list[int] = []
    prep = preparer(tmp_path, claims)
    prep.listeners.append(lambda: changed.append(1))
    prepared = {d.device_name: d for d in prep.prepare(ref)}
    assert changed == [1]  # the publisher moves the open GPU
    assert prepared["gpu-2-compute-0"].cdi_device_ids == ("gpuweave.io/claim=u1-units-container-0-request-0",)
    assert prepared["gpu-2-memory-0"].cdi_device_ids == ("gpuweave.io/claim=u1-units-container-0-request-1",)
    assert prepared["gpu-2-compute-1"].cdi_device_ids == ()  # one CDI device per request
    assert prepared["gpu-2-compute-29"].request_names == ("container-0-request-0",)
    spec = json.loads((tmp_path / "cdi" / "gpuweave.io-claim_u1.json").read_text())
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert set(devices) == {"u1-units-container-0-request-0", "u1-units-container-0-request-1"}
    env0 = dict(e.split("=", 1) for e in devices["u1-units-container-0-request-0"]["env"])
    env1 = dict(e.split("=", 1) for e in devices["u1-units-container-0-request-1"]["env"])
    assert env0 == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PIPE_DIRECTORY": pipe_of(gpu_uuid(2)),
    }
    assert env1 == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10G",
        "CUDA_MPS_PIPE_DIRECTORY": pipe_of(gpu_uuid(2)),
    }
    for edits in devices.values():
        assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia2"]
        assert [m["hostPath"] for m in edits["mounts"]] == [pipe_of(gpu_uuid(2))]
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(2)}"]
    prep.unprepare(ref)
    assert changed == [1, 1]


def test_units_from_two_gpus_are_refused(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add(
        "u2", [("container-0-request-0", "gpu-2-compute-0"), ("container-0-request-0", "gpu-3-compute-0")]
    )
    with pytest.raises(ClaimError, match="come from 2 GPUs"):
        preparer(tmp_path, claims).prepare(ref)


def test_device_classes_map_the_device_plugins_resource_names() -> None:
    docs = yaml.safe_load_all((REPO / "manifests" / "dra" / "deviceclasses.yaml").read_text())
    names = {d["metadata"]["name"]: d["spec"].get("extendedResourceName") for d in docs}
    assert names["gpu.gpuweave.io"] == "nvidia.com/gpu"
    assert names["gpu-compute.gpuweave.io"] == "gpuweave.io/gpu-compute"
    assert names["gpu-memory.gpuweave.io"] == "gpuweave.io/gpu-memory"
    assert names["gpu-share.gpuweave.io"] is None  # claims ask it for capacity, not a count


def test_a_failed_gpu_taints_its_shared_device_and_units_so_every_claim_on_it_is_evicted() -> None:
    taints = device_taints(POOL, {gpu_uuid(2): DeviceCondition(DeviceState.FAILED, "Xid 79")})
    assert taints["gpu-2-share"][0].effect == "NoExecute"  # every claim sharing it: evicted
    assert taints["gpu-2-compute-5"][0].effect == "NoExecute"
    assert "gpu-3-share" not in taints and "gpu-3-memory-0" not in taints  # never a sibling
