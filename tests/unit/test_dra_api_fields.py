"""What the API server keeps of a ResourceSlice: fields dropped by a gate that is off are found by
comparing a write with its answer, and the pool is reduced to one that needs none of them."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from devicemodel.inventory import NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from dradriver.api_fields import ServedFields, SliceFeature, dropped_features, served_devices, without_fields
from dradriver.devices import DraKind, MigPublishing, dra_devices
from dradriver.shares import with_shares
from dradriver.slices import build_resource_slices, pool_slices
from dradriver.taint import Taint
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend

UNHEALTHY = Taint("gpuweave.io/unhealthy", "failed", "NoExecute")


def discovered(profile: str) -> NodeInventory:
    backend = SimulatedBackend(load_profile(profile), node_name="n0")
    try:
        return backend.discover()
    finally:
        backend.close()


def as_stored(slices: list[dict[str, Any]], features: frozenset[SliceFeature]) -> list[dict[str, Any]]:
    """The slices as an API server with the gates of ``features`` off stores them."""
    return [{**s, "spec": without_fields(s["spec"], features)} for s in copy.deepcopy(slices)]


def test_a_server_that_keeps_everything_drops_nothing() -> None:
    sent = pool_slices(discovered("dgx-h100"), mig=MigPublishing.DYNAMIC, taints={"gpu-1": (UNHEALTHY,)})
    assert dropped_features(sent, copy.deepcopy(sent)) == frozenset()


def test_dropped_counters_and_taints_are_found_by_reading_back() -> None:
    sent = pool_slices(discovered("dgx-h100"), mig=MigPublishing.DYNAMIC, taints={"gpu-1": (UNHEALTHY,)})
    stored = as_stored(sent, frozenset(SliceFeature))
    assert dropped_features(sent, stored) == {SliceFeature.PARTITIONABLE, SliceFeature.TAINTS}


def test_dropped_shared_device_fields_are_found() -> None:
    inventory = discovered("dgx-h100")
    plan = SharingPlan(per_gpu={"2": GpuSharing(SharingMode.FRACTIONAL)})
    sent = pool_slices(inventory, sharing=plan)
    stored = as_stored(sent, frozenset({SliceFeature.CONSUMABLE}))
    assert dropped_features(sent, stored) == {SliceFeature.CONSUMABLE}


def test_a_pool_without_counters_serves_whole_gpus_and_no_placements_or_shares() -> None:
    inventory = discovered("dgx-h100")
    plan = SharingPlan(per_gpu={"2": GpuSharing(SharingMode.FRACTIONAL)})
    pool = with_shares(dra_devices(inventory, mig=MigPublishing.DYNAMIC), inventory, plan)
    kept, _ = served_devices(pool, {}, frozenset({SliceFeature.PARTITIONABLE}))
    assert {d.kind for d in kept} == {DraKind.GPU}
    assert sorted(d.name for d in kept) == [f"gpu-{i}" for i in range(8) if i != 2]
    assert all(not d.consumes and d.counter_set is None for d in kept)
    slices = build_resource_slices(inventory, kept)
    assert not any(s["spec"].get("sharedCounters") for s in slices)
    assert dropped_features(slices, as_stored(slices, frozenset(SliceFeature))) == frozenset()


def test_a_pool_without_taints_leaves_tainted_devices_out() -> None:
    pool = dra_devices(discovered("dgx-h100"))
    kept, taints = served_devices(pool, {"gpu-3": (UNHEALTHY,)}, frozenset({SliceFeature.TAINTS}))
    assert "gpu-3" not in {d.name for d in kept} and len(kept) == len(pool) - 1
    assert taints == {}
    everything, still = served_devices(pool, {"gpu-3": (UNHEALTHY,)}, frozenset())
    assert everything == pool and still == {"gpu-3": (UNHEALTHY,)}


def test_served_fields_logs_each_feature_once(caplog: pytest.LogCaptureFixture) -> None:
    sent = pool_slices(discovered("dgx-h100"), mig=MigPublishing.DYNAMIC)
    stored = as_stored(sent, frozenset(SliceFeature))
    served = ServedFields()
    with caplog.at_level(logging.WARNING, logger="dradriver.api_fields"):
        assert served.learn(sent, stored) == {SliceFeature.PARTITIONABLE}
        assert served.learn(sent, stored) == frozenset()
    assert served.unsupported == {SliceFeature.PARTITIONABLE}
    (line,) = [r.getMessage() for r in caplog.records]
    assert "DRAPartitionableDevices" in line and "MIG placements" in line
