"""Fractional GPUs in DRA: the shared device a fractional GPU is published as (consumable capacity),
the consumed capacity read from the allocation, and the MPS edits prepare gives each share, which
are the device plugin's Allocate edits for the same units."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.assignment import device_id_share
from devicemodel.contracts import RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from dradriver.claim_cdi import ClaimSpecWriter
from dradriver.devices import DraDevice, MigPublishing, dra_devices
from dradriver.prepare import ClaimError, ClaimPreparer, ClaimRef
from dradriver.shares import ShareEdits, ShareError, share_allocations, with_shares
from dradriver.slices import pool_slices
from hardware.device_nodes import CharDevice, HostDeviceNodes
from nodeagent.allocation import DeviceListing, DeviceListStrategy, grant_for
from nodeagent.devices import build_catalogue
from nodeagent.errors import AllocationRejectedError
from tests.support.small_inventory import gpu_uuid, small_inventory

REPO = Path(__file__).parents[2]
HOST = HostDeviceNodes(control=(CharDevice("/dev/nvidiactl", 195, 255),))
PIPES = "/run/gpuweave/mps"
PLAN = SharingPlan(per_gpu={"2": GpuSharing(SharingMode.FRACTIONAL), "3": GpuSharing(SharingMode.FRACTIONAL)})


def pipe_of(uuid: str) -> str:
    return f"{PIPES}/{uuid}/pipe"


def published(plan: SharingPlan = PLAN, **kwargs: Any) -> dict[str, dict[str, Any]]:
    slices = pool_slices(small_inventory(**kwargs), sharing=plan)
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_a_fractional_gpu_is_one_device_claims_share_with_compute_and_memory_capacity() -> None:
    devices = published()
    assert {n for n in devices if not n.startswith(("gpu-2-", "gpu-3-"))} >= {"gpu-0", "gpu-1"}
    assert {"gpu-2-share", "gpu-3-share"} <= set(devices)
    assert "gpu-2" not in devices and "gpu-3" not in devices  # one mode per GPU
    share = devices["gpu-2-share"]
    assert share["allowMultipleAllocations"] is True
    assert share["attributes"]["type"] == {"string": "gpu-share"}
    assert share["attributes"]["uuid"] == {"string": gpu_uuid(2)}
    compute, memory = share["capacity"]["compute"], share["capacity"]["memory"]
    assert compute["value"] == "100" and memory["value"] == "80Gi"
    # a capacity a claim does not name is charged at the default: 0, so compute-only claims pack
    assert compute["requestPolicy"] == {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}
    assert memory["requestPolicy"] == {
        "default": "0",
        "validRange": {"min": "0", "max": "80Gi", "step": "1Gi"},
    }
    assert "allowMultipleAllocations" not in devices["gpu-0"]


def test_without_a_sharing_plan_every_gpu_is_whole() -> None:
    devices = published(SharingPlan())
    assert [n for n in devices if n.startswith("gpu-")] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_a_gpu_in_mig_mode_stays_mig_and_dynamic_mig_placements_of_a_fractional_gpu_go() -> None:
    devices = published(mig_on=(2,))
    assert "gpu-2-share" not in devices and any(n.startswith("gpu-2-mig-") for n in devices)
    inventory = small_inventory()
    dynamic = with_shares(dra_devices(inventory, mig=MigPublishing.DYNAMIC), inventory, PLAN)
    names = [d.name for d in dynamic]
    assert "gpu-3-share" in names and not [n for n in names if n.startswith("gpu-3-mig")]
    assert [n for n in names if n.startswith("gpu-1-mig")]  # an exclusive GPU keeps its placements
    share = next(d for d in dynamic if d.name == "gpu-3-share")
    # not the MIG counters: the GPU's share counters, all of them (charged once however shared)
    assert share.counter_set == "gpu-3-share" and share.consumes == {"compute": 100, "memory": 80}


def result(device: str, *, share_id: str = "s-1", **consumed: str) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": "gpuweave.io",
        "pool": "node-a",
        "device": device,
        "shareID": share_id,
        "consumedCapacity": consumed,
    }


def test_consumed_capacity_becomes_units() -> None:
    shares = share_allocations([result("gpu-2-share", compute="30", memory="10Gi")], shared={"gpu-2-share"})
    share = shares["gpu-2-share"]
    assert (share.compute, share.memory_gib, share.share_id) == (30, 10, "s-1")
    other = share_allocations([result("gpu-2-share", memory="10737418240")], shared={"gpu-2-share"})
    assert (other["gpu-2-share"].compute, other["gpu-2-share"].memory_gib) == (0, 10)
    assert share_allocations([result("gpu-0", compute="30")], shared={"gpu-2-share"}) == {}


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ([{"device": "gpu-2-share", "request": "gpu"}], "no consumedCapacity"),
        ([result("gpu-2-share", compute="0", memory="0")], "neither compute nor memory"),
        ([result("gpu-2-share", compute="30"), result("gpu-2-share", compute="20")], "one share per GPU"),
        ([result("gpu-2-share", compute="lots")], "not a Kubernetes quantity"),
        ([result("gpu-2-share", compute="130")], "more than a GPU's 100"),
    ],
)
def test_a_share_that_cannot_be_prepared_is_refused_with_the_reason(
    results: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ShareError, match=message):
        share_allocations(results, shared={"gpu-2-share"})


def edits_for(pipes: Any = pipe_of) -> ShareEdits:
    inventory = small_inventory()
    return ShareEdits(sharing=lambda: (inventory, PLAN), pipes=lambda: pipes)


def test_a_shares_edits_are_the_device_plugins_allocate_for_the_same_units() -> None:
    (share,) = share_allocations(
        [result("gpu-2-share", compute="30", memory="10Gi")], shared={"gpu-2-share"}
    ).values()
    edits = edits_for().edits(gpu_uuid(2), share)
    catalogue = build_catalogue(small_inventory(), PLAN)
    listing = DeviceListing(strategies=frozenset({DeviceListStrategy.ENVVAR}))
    allocate_env: dict[str, str] = {}
    mounts = set()
    for resource, kind, units in ((RESOURCE_GPU_COMPUTE, "compute", 30), (RESOURCE_GPU_MEMORY, "memory", 10)):
        grant = grant_for(
            resource,
            [device_id_share(gpu_uuid(2), kind, k) for k in range(units)],
            devices={d.id: d for d in catalogue[resource]},
            unhealthy={},
            mps_pipe_dir=pipe_of,
            listing=listing,
        )
        allocate_env |= grant.envs
        mounts |= {(m.host_path, m.container_path) for m in grant.mounts}
    del allocate_env["NVIDIA_VISIBLE_DEVICES"]  # named once for the whole claim
    assert dict(e.split("=", 1) for e in edits["env"]) == allocate_env
    assert allocate_env == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10G",
        "CUDA_MPS_PIPE_DIRECTORY": pipe_of(gpu_uuid(2)),
    }
    assert {(m["hostPath"], m["containerPath"]) for m in edits["mounts"]} == mounts
    assert edits["mounts"][0]["options"] == ["rbind", "rw"]


def test_a_compute_only_share_sets_no_memory_limit() -> None:
    (share,) = share_allocations([result("gpu-3-share", compute="50")], shared={"gpu-3-share"}).values()
    env = dict(e.split("=", 1) for e in edits_for().edits(gpu_uuid(3), share)["env"])
    assert env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PIPE_DIRECTORY": pipe_of(gpu_uuid(3))}


def test_a_gpu_whose_daemon_is_down_gets_no_share() -> None:
    def down(uuid: str) -> str:
        raise AllocationRejectedError(f"GPU {uuid}: no live MPS control daemon (it exited)")

    (share,) = share_allocations([result("gpu-2-share", compute="30")], shared={"gpu-2-share"}).values()
    with pytest.raises(ShareError, match="no live MPS control daemon"):
        edits_for(down).edits(gpu_uuid(2), share)


class Claims:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def add(self, uid: str, *results: dict[str, Any]) -> ClaimRef:
        self.claims[uid] = {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}},
        }
        return ClaimRef(uid, "ns", f"claim-{uid}")

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[name.removeprefix("claim-")]


def preparer(tmp_path: Path, claims: Claims, pipes: Any = pipe_of) -> ClaimPreparer:
    inventory = small_inventory()
    pool: tuple[DraDevice, ...] = with_shares(dra_devices(inventory), inventory, PLAN)
    return ClaimPreparer(
        pool="node-a",
        state_dir=tmp_path,
        source=claims,
        devices=lambda: (inventory, pool),
        specs=ClaimSpecWriter(tmp_path / "cdi"),
        host=lambda: HOST,
        share_edits=edits_for(pipes),
    )


def spec_of(tmp_path: Path, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "cdi" / f"gpuweave.io-claim_{uid}.json").read_text())
    return data


def env_of(spec: Mapping[str, Any]) -> dict[str, str]:
    (device,) = spec["devices"]
    pairs = [*spec["containerEdits"].get("env", []), *device["containerEdits"]["env"]]
    return dict(p.split("=", 1) for p in pairs)


def test_two_claims_on_one_gpu_get_one_pipe_directory_and_their_own_limits(tmp_path: Path) -> None:
    claims = Claims()
    first = claims.add("u1", result("gpu-2-share", share_id="a", compute="30"))
    second = claims.add("u2", result("gpu-2-share", share_id="b", compute="50", memory="20Gi"))
    prep = preparer(tmp_path, claims)
    (one,) = prep.prepare(first)
    (two,) = prep.prepare(second)
    assert (one.share_id, two.share_id) == ("a", "b")
    assert one.cdi_device_ids == ("gpuweave.io/claim=u1-gpu-2-share",)
    env1, env2 = env_of(spec_of(tmp_path, "u1")), env_of(spec_of(tmp_path, "u2"))
    assert env1["CUDA_MPS_PIPE_DIRECTORY"] == env2["CUDA_MPS_PIPE_DIRECTORY"] == pipe_of(gpu_uuid(2))
    assert env1["NVIDIA_VISIBLE_DEVICES"] == env2["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(2)
    threads = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
    assert (env1[threads], env2[threads]) == ("30", "50")
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env1
    assert env2["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20G"
    (device,) = spec_of(tmp_path, "u1")["devices"]
    assert {n["path"] for n in device["containerEdits"]["deviceNodes"]} == {"/dev/nvidia2"}
    # the checkpoint answers a restarted agent with the same share IDs
    again = preparer(tmp_path, claims, pipes=None).prepare(first)
    assert again[0].share_id == "a"


def test_a_share_whose_gpu_has_no_daemon_is_a_prepare_error_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    def down(uuid: str) -> str:
        raise AllocationRejectedError(f"GPU {uuid}: no live MPS control daemon (it exited)")

    claims = Claims()
    ref = claims.add("u1", result("gpu-2-share", compute="30"))
    with pytest.raises(ClaimError, match="no live MPS control daemon"):
        preparer(tmp_path, claims, pipes=down).prepare(ref)
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())


def test_the_device_class_and_the_example_share_claims() -> None:
    docs = yaml.safe_load_all((REPO / "manifests" / "dra" / "deviceclasses.yaml").read_text())
    classes = {d["metadata"]["name"]: d["spec"] for d in docs}
    expression = classes["gpu-share.gpuweave.io"]["selectors"][0]["cel"]["expression"]
    assert 'device.attributes["gpuweave.io"].type == "gpu-share"' in expression
    text = (REPO / "manifests" / "dra" / "example-claims-shares.yaml").read_text()
    examples = list(yaml.safe_load_all(text))
    requests = [r for doc in examples for r in doc["spec"]["spec"]["devices"]["requests"]]
    assert {r["exactly"]["deviceClassName"] for r in requests} == {"gpu-share.gpuweave.io"}
    assert any(r["exactly"].get("capacity") for r in requests)
