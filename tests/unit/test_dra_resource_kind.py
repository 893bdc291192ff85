"""A resource kind added by registering one module, in DRA mode: its devices are published in the
node's ResourceSlices (``type`` its kind's word) and a claim for them is prepared with what its
kind's Allocate hands a container, as CDI edits. Unregistered, nothing of it is published."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from devicemodel.inventory import NodeInventory
from dradriver.claim_cdi import ClaimSpecWriter
from dradriver.devices import dra_devices
from dradriver.prepare import ClaimPreparer, ClaimRef
from dradriver.slices import pool_slices
from hardware.device_nodes import CharDevice, HostDeviceNodes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from tests.support.widget_kind import WIDGETS_ENV, TestWidget, registered_widget

HOST = HostDeviceNodes(control=(CharDevice("/dev/nvidiactl", 195, 255),))


@pytest.fixture(scope="module")
def inventory() -> NodeInventory:
    backend = SimulatedBackend(load_profile("p5.48xlarge"), node_name="n0")
    try:
        return backend.discover()
    finally:
        backend.close()


@pytest.fixture
def widgets() -> Iterator[TestWidget]:
    with registered_widget() as kind:
        yield kind


def _published(inventory: NodeInventory) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in pool_slices(inventory) for d in s["spec"].get("devices", [])}


def _type(device: Mapping[str, Any]) -> Any:
    (value,) = device["attributes"]["type"].values()
    return value


@pytest.mark.usefixtures("widgets")
def test_a_registered_kind_is_published_and_prepared_with_its_grant(
    inventory: NodeInventory, tmp_path: Path
) -> None:
    published = _published(inventory)
    widgets = sorted(name for name, d in published.items() if _type(d) == "widget")
    assert len(widgets) == len(inventory.nics) == 32
    assert sum(1 for d in published.values() if _type(d) == "gpu") == 8  # the others as before
    chosen = widgets[:2]

    class Claims:
        def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
            results = [{"request": "w", "driver": "gpuweave.io", "pool": "n0", "device": d} for d in chosen]
            return {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": results}}}}

    preparer = ClaimPreparer(
        pool="n0",
        state_dir=tmp_path,
        source=Claims(),
        devices=lambda: (inventory, dra_devices(inventory)),
        specs=ClaimSpecWriter(tmp_path / "cdi"),
        host=lambda: HOST,
    )
    prepared = preparer.prepare(ClaimRef("u1", "ns", "c"))
    assert [(p.device_name, p.cdi_device_ids) for p in prepared] == [
        (name, (f"gpuweave.io/claim=u1-{name}",)) for name in chosen
    ]
    spec = json.loads((tmp_path / "cdi" / "gpuweave.io-claim_u1.json").read_text())
    edits = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    by_name = {d.name: d for d in dra_devices(inventory)}
    for name in chosen:
        plugin = by_name[name].plugin
        assert plugin is not None and edits[f"u1-{name}"] == {"env": [f"{WIDGETS_ENV}={plugin.id}"]}
    assert "containerEdits" not in spec  # no GPU: no control nodes, no NVIDIA_VISIBLE_DEVICES


def test_without_the_registry_line_nothing_of_it_is_published(inventory: NodeInventory) -> None:
    assert not [d for d in _published(inventory).values() if _type(d) == "widget"]
