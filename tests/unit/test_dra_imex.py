"""The IMEX channel in DRA mode: published on nodes with a clique only, with its clique; prepared as the
channel's device node and NVIDIA_IMEX_CHANNELS for the containers that use its request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.inventory import NodeInventory
from dradriver.claim_cdi import ClaimSpecWriter, claim_spec
from dradriver.devices import DraDevice, MigPublishing, dra_devices
from dradriver.prepare import ClaimPreparer, ClaimRef
from dradriver.slices import pool_slices
from dradriver.taints import DeviceCondition, device_taints
from hardware.device_nodes import CharDevice, HostDeviceNodes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from health.policy import DeviceState

REPO = Path(__file__).parents[2]
CHANNEL = "imex-channel-0"
CHANNEL_NODE = "/dev/nvidia-caps-imex-channels/channel0"
HOST = HostDeviceNodes(control=(CharDevice("/dev/nvidiactl", 195, 255),))
_DISCOVERED: dict[str, NodeInventory] = {}


def discovered(profile: str) -> NodeInventory:
    if profile not in _DISCOVERED:
        backend = SimulatedBackend(load_profile(profile), node_name="n0")
        try:
            _DISCOVERED[profile] = backend.discover()
        finally:
            backend.close()
    return _DISCOVERED[profile]


def published(profile: str, mig: MigPublishing = MigPublishing.STATIC) -> dict[str, dict[str, Any]]:
    slices = pool_slices(discovered(profile), mig=mig)
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def attr(device: Mapping[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


@pytest.mark.parametrize("mig", list(MigPublishing))
def test_a_gb200_tray_publishes_one_channel_with_the_clique_of_its_gpus(mig: MigPublishing) -> None:
    devices = published("gb200-compute-tray", mig)
    channels = [d for d in devices.values() if attr(d, "type") == "imex-channel"]
    assert [d["name"] for d in channels] == [CHANNEL]
    (channel,) = channels
    assert attr(channel, "channel") == 0
    clique = attr(channel, "clique")
    assert clique and {attr(devices[f"gpu-{i}"], "clique") for i in range(4)} == {clique}
    for name in ("cliqueID", "clusterUUID"):
        assert attr(channel, name) == attr(devices["gpu-0"], name)
    assert "capacity" not in channel and "consumesCounters" not in channel


@pytest.mark.parametrize("profile", ["dgx-h100", "p5.48xlarge"])
def test_nodes_without_a_clique_publish_no_channel(profile: str) -> None:
    devices = published(profile)
    assert devices and not [d for d in devices.values() if attr(d, "type") == "imex-channel"]


def test_the_device_class_selects_the_type_the_channel_carries() -> None:
    docs = yaml.safe_load_all((REPO / "manifests" / "dra" / "deviceclasses.yaml").read_text())
    classes = {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"] for d in docs}
    assert 'device.attributes["gpuweave.io"].type == "imex-channel"' in classes["imex-channel.gpuweave.io"]
    template = yaml.safe_load((REPO / "manifests" / "dra" / "example-claims-imex.yaml").read_text())
    requests = {
        r["name"]: r["exactly"]["deviceClassName"] for r in template["spec"]["spec"]["devices"]["requests"]
    }
    assert requests == {"gpus": "gpu.gpuweave.io", "imex": "imex-channel.gpuweave.io"}


def _chosen(*names: str) -> list[DraDevice]:
    by_name = {d.name: d for d in dra_devices(discovered("gb200-compute-tray"))}
    return [by_name[n] for n in names]


def test_the_claim_spec_gives_the_channel_node_and_env_as_the_channels_own_edits() -> None:
    inventory = discovered("gb200-compute-tray")
    spec, problems = claim_spec("u1", inventory, _chosen("gpu-0", CHANNEL), host=HOST)
    assert problems == ()
    edits = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert edits[f"u1-{CHANNEL}"] == {
        "deviceNodes": [{"path": CHANNEL_NODE, "hostPath": CHANNEL_NODE, "permissions": "rw"}],
        "env": ["NVIDIA_IMEX_CHANNELS=0"],
    }
    assert [n["path"] for n in edits["u1-gpu-0"]["deviceNodes"]] == ["/dev/nvidia0"]
    assert "env" not in edits["u1-gpu-0"]
    gpu_uuid = inventory.gpus[0].uuid
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={gpu_uuid}"]  # the channel is no GPU


def test_a_claim_for_the_channel_alone_gets_only_the_channel() -> None:
    spec, _ = claim_spec("u2", discovered("gb200-compute-tray"), _chosen(CHANNEL), host=HOST)
    assert [d["name"] for d in spec["devices"]] == [f"u2-{CHANNEL}"]
    assert "containerEdits" not in spec  # no GPU: no control nodes, no NVIDIA_VISIBLE_DEVICES


class _Claims:
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        results = [
            {"request": r, "driver": "gpuweave.io", "pool": "n0", "device": d}
            for r, d in (("gpus", "gpu-2"), ("imex", CHANNEL))
        ]
        return {"metadata": {"uid": "u3"}, "status": {"allocation": {"devices": {"results": results}}}}


def test_prepare_answers_the_channel_with_its_cdi_id_and_writes_its_edits(tmp_path: Path) -> None:
    inventory = discovered("gb200-compute-tray")
    preparer = ClaimPreparer(
        pool="n0",
        state_dir=tmp_path,
        source=_Claims(),
        devices=lambda: (inventory, dra_devices(inventory)),
        specs=ClaimSpecWriter(tmp_path / "cdi"),
        host=lambda: HOST,
    )
    prepared = preparer.prepare(ClaimRef("u3", "ns", "c"))
    assert [(p.device_name, p.request_names, p.cdi_device_ids) for p in prepared] == [
        ("gpu-2", ("gpus",), ("gpuweave.io/claim=u3-gpu-2",)),
        (CHANNEL, ("imex",), (f"gpuweave.io/claim=u3-{CHANNEL}",)),
    ]
    spec = json.loads((tmp_path / "cdi" / "gpuweave.io-claim_u3.json").read_text())
    channel = next(d for d in spec["devices"] if d["name"] == f"u3-{CHANNEL}")
    assert channel["containerEdits"]["env"] == ["NVIDIA_IMEX_CHANNELS=0"]


def test_a_failed_gpu_does_not_taint_the_channel() -> None:
    devices = dra_devices(discovered("gb200-compute-tray"))
    gpu = next(d for d in devices if d.name == "gpu-0")
    taints = device_taints(devices, {str(gpu.gpu_uuid): DeviceCondition(DeviceState.FAILED)})
    assert set(taints) == {"gpu-0"}
