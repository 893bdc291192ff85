"""The DRA kubelet plugin over real unix sockets, a gRPC client standing in for the kubelet's DRA
manager: registration GetInfo, prepare/unprepare with CDI specs, restart keeps prepared claims,
bad input, the IMEX channel of a GB200 tray."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from dradriver.claim_cdi import CLAIM_KIND, ClaimSpecWriter, claim_file_name
from dradriver.devices import DraDevice, dra_devices
from dradriver.health_stream import HealthStream
from dradriver.plugin import DraPluginServer, RegistrationService
from dradriver.prepare import CHECKPOINT_FILE, ClaimError, ClaimPreparer
from hardware.device_nodes import CharDevice, HostDeviceNodes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from proto.dra.health.v1 import api_pb2 as health_pb2
from proto.dra.health.v1 import api_pb2_grpc as health_grpc
from proto.dra.v1 import api_pb2 as dra_v1
from proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from proto.pluginregistration.v1 import api_pb2 as reg_pb2
from proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.support.agent_process import short_temp_dir
from tests.support.small_inventory import gpu_uuid, small_inventory

NODE = "node-a"
HOST = HostDeviceNodes(
    control=(CharDevice("/dev/nvidiactl", 195, 255),),
    uverbs={
        f"/dev/infiniband/uverbs{n}": CharDevice(f"/dev/infiniband/uverbs{n}", 231, 192 + n) for n in range(2)
    },
)


@dataclass
class ApiClaims:
    """The ClaimSource interface over a dict of ResourceClaim JSON objects (what the API returns)."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads += 1
        claim = self.claims.get((namespace, name))
        if claim is None:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found")
        return claim

    def add(self, uid: str, name: str, results: list[tuple[str, str]], *, pool: str = NODE) -> None:
        self.claims[("ns", name)] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": r, "driver": "gpuweave.io", "pool": pool, "device": d}
                            for r, d in results
                        ]
                    }
                }
            },
        }


@dataclass
class Plugin:
    root: Path
    state: Path
    cdi: Path
    source: ApiClaims
    inventory: NodeInventory
    server: DraPluginServer | None = None

    def start(self) -> DraPluginServer:
        devices: tuple[DraDevice, ...] = dra_devices(self.inventory)
        preparer = ClaimPreparer(
            pool=NODE,
            state_dir=self.state,
            source=self.source,
            devices=lambda: (self.inventory, devices),
            specs=ClaimSpecWriter(self.cdi),
            host=lambda: HOST,
        )
        self.server = DraPluginServer(preparer, kubelet_root=self.root)
        self.server.start()
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def dra(self) -> Any:
        assert self.server is not None
        return dra_v1_grpc.DRAPluginStub(grpc.insecure_channel(f"unix:{self.server.socket_path}"))


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    base = short_temp_dir()
    made = Plugin(base / "kubelet", base / "state", base / "cdi", ApiClaims(), small_inventory())
    made.state.mkdir()
    made.start()
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(base, ignore_errors=True)


def claim(uid: str, name: str) -> dra_v1.Claim:
    return dra_v1.Claim(uid=uid, namespace="ns", name=name)


def prepare(plugin: Plugin, *claims: dra_v1.Claim) -> Any:
    return plugin.dra().NodePrepareResources(dra_v1.NodePrepareResourcesRequest(claims=claims), timeout=10)


def test_registration_get_info_is_what_the_kubelet_checks(plugin: Plugin) -> None:
    assert plugin.server is not None
    path = plugin.root / "plugins_registry" / "gpuweave.io-reg.sock"
    assert path.is_socket()
    stub = reg_grpc.RegistrationStub(grpc.insecure_channel(f"unix:{path}"))
    info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=10)
    assert info.type == "DRAPlugin" and info.name == "gpuweave.io"
    assert info.endpoint == str(plugin.root / "plugins" / "gpuweave.io" / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=10)
    assert plugin.server.registration.registered.is_set()
    stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=False, error="no"), timeout=10)
    assert not plugin.server.registration.registered.is_set() and plugin.server.registration.error == "no"


def test_prepare_writes_a_cdi_spec_and_unprepare_removes_it(plugin: Plugin) -> None:
    plugin.source.add("uid-1", "c1", [("gpus", "gpu-0"), ("gpus", "gpu-1"), ("nic", "efa-rdmap16s0")])
    response = prepare(plugin, claim("uid-1", "c1"))
    answer = response.claims["uid-1"]
    assert answer.error == ""
    assert [(d.device_name, list(d.request_names), d.pool_name) for d in answer.devices] == [
        ("gpu-0", ["gpus"], NODE),
        ("gpu-1", ["gpus"], NODE),
        ("efa-rdmap16s0", ["nic"], NODE),
    ]
    assert list(answer.devices[0].cdi_device_ids) == [f"{CLAIM_KIND}=uid-1-gpu-0"]
    spec = json.loads((plugin.cdi / claim_file_name("uid-1")).read_text())
    assert spec["kind"] == CLAIM_KIND
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={gpu_uuid(0)},{gpu_uuid(1)}"]
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert nodes == {
        "uid-1-gpu-0": ["/dev/nvidia0"],
        "uid-1-gpu-1": ["/dev/nvidia1"],
        "uid-1-efa-rdmap16s0": ["/dev/infiniband/uverbs0"],
    }
    assert "/dev/nvidiactl" in [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    request = dra_v1.NodeUnprepareResourcesRequest(claims=[claim("uid-1", "c1")])
    assert plugin.dra().NodeUnprepareResources(request, timeout=10).claims["uid-1"].error == ""
    assert not (plugin.cdi / claim_file_name("uid-1")).exists()
    again = plugin.dra().NodeUnprepareResources(request, timeout=10)  # idempotent
    assert again.claims["uid-1"].error == ""


def test_prepare_hands_the_imex_channel_of_a_gb200_tray() -> None:
    backend = SimulatedBackend(load_profile("gb200-compute-tray"), node_name=NODE)
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    base = short_temp_dir()
    tray = Plugin(base / "kubelet", base / "state", base / "cdi", ApiClaims(), inventory)
    tray.state.mkdir()
    tray.start()
    try:
        tray.source.add("uid-imex", "imex", [("gpus", "gpu-0"), ("imex", "imex-channel-0")])
        answer = prepare(tray, claim("uid-imex", "imex")).claims["uid-imex"]
        assert answer.error == ""
        assert [(d.device_name, list(d.request_names), list(d.cdi_device_ids)) for d in answer.devices] == [
            ("gpu-0", ["gpus"], [f"{CLAIM_KIND}=uid-imex-gpu-0"]),
            ("imex-channel-0", ["imex"], [f"{CLAIM_KIND}=uid-imex-imex-channel-0"]),
        ]
        spec = json.loads((tray.cdi / claim_file_name("uid-imex")).read_text())
        edits = {d["name"]: d["containerEdits"] for d in spec["devices"]}
        channel = edits["uid-imex-imex-channel-0"]
        assert [n["path"] for n in channel["deviceNodes"]] == ["/dev/nvidia-caps-imex-channels/channel0"]
        assert channel["env"] == ["NVIDIA_IMEX_CHANNELS=0"]
    finally:
        tray.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_prepare_is_idempotent_and_restart_keeps_prepared_claims(plugin: Plugin) -> None:
    plugin.source.add("uid-2", "c2", [("gpu", "gpu-3")])
    first = prepare(plugin, claim("uid-2", "c2"))
    reads = plugin.source.reads
    assert prepare(plugin, claim("uid-2", "c2")) == first and plugin.source.reads == reads
    checkpoint = json.loads((plugin.state / CHECKPOINT_FILE).read_text())
    assert set(checkpoint["claims"]) == {"uid-2"}
    plugin.stop()
    (plugin.cdi / claim_file_name("uid-2")).unlink()  # lost with the agent: written again at start
    stray = ClaimSpecWriter(plugin.cdi)
    stray.write("uid-never-checkpointed", {"kind": CLAIM_KIND, "devices": []})
    del plugin.source.claims[("ns", "c2")]  # the restarted agent must not need the API for it
    plugin.start()
    assert prepare(plugin, claim("uid-2", "c2")) == first
    assert stray.claim_uids() == {"uid-2"}


def test_v1beta1_is_served_too(plugin: Plugin) -> None:
    assert plugin.server is not None
    plugin.source.add("uid-3", "c3", [("gpu", "gpu-2")])
    stub = dra_v1beta1_grpc.DRAPluginStub(grpc.insecure_channel(f"unix:{plugin.server.socket_path}"))
    request = dra_v1beta1.NodePrepareResourcesRequest(
        claims=[dra_v1beta1.Claim(uid="uid-3", namespace="ns", name="c3")]
    )
    answer = stub.NodePrepareResources(request, timeout=10).claims["uid-3"]
    assert answer.error == "" and answer.devices[0].device_name == "gpu-2"


def test_bad_claims_get_their_own_error_and_others_are_prepared(plugin: Plugin) -> None:
    plugin.source.add("uid-ok", "ok", [("gpu", "gpu-0")])
    plugin.source.add("uid-gone", "gone", [("gpu", "gpu-9")])
    plugin.source.add("uid-other", "other", [("gpu", "gpu-0")], pool="node-b")
    plugin.source.add("uid-real", "replaced", [("gpu", "gpu-1")])
    response = prepare(
        plugin,
        claim("uid-ok", "ok"),
        claim("uid-gone", "gone"),
        claim("uid-other", "other"),
        claim("uid-missing", "missing"),
        claim("uid-stale", "replaced"),
        dra_v1.Claim(uid="uid-noname", namespace="ns"),
    )
    errors = {uid: answer.error for uid, answer in response.claims.items()}
    assert errors["uid-ok"] == ""
    assert "gpu-9 is not in this node's pool" in errors["uid-gone"]
    assert "no device of driver gpuweave.io in pool node-a" in errors["uid-other"]
    assert "not found" in errors["uid-missing"]
    assert "has uid uid-real" in errors["uid-stale"]
    assert "namespace and name are required" in errors["uid-noname"]
    assert ClaimSpecWriter(plugin.cdi).claim_uids() == {"uid-ok"}


def test_a_claim_without_uid_or_undecodable_bytes_is_invalid_argument(plugin: Plugin) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        prepare(plugin, dra_v1.Claim(namespace="ns", name="x"))
    assert missing.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert plugin.server is not None
    channel = grpc.insecure_channel(f"unix:{plugin.server.socket_path}")
    raw = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources")
    with pytest.raises(grpc.RpcError) as garbage:
        raw(b"\xff\xff\xff", timeout=10)
    assert garbage.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    plugin.source.add("uid-after", "after", [("gpu", "gpu-0")])
    assert prepare(plugin, claim("uid-after", "after")).claims["uid-after"].error == ""  # still serving


def test_corrupt_checkpoint_refuses_to_start(plugin: Plugin) -> None:
    plugin.stop()
    (plugin.state / CHECKPOINT_FILE).write_text("{not json")
    with pytest.raises(Exception, match="DRA claim checkpoint"):
        plugin.start()


CLAIM = {"namespace": "n", "name": "c"}


@pytest.mark.parametrize(
    ("checkpoint", "where"),
    [
        ([], "file: Input should be a valid dictionary"),
        ({"claims": {}}, "version: Field required"),
        ({"version": 1, "claims": None}, "claims: Input should be a valid dictionary"),
        ({"version": 1, "claims": {"u": {"name": "c"}}}, "claims.u.namespace: Field required"),
        ({"version": 1, "claims": {"u": {**CLAIM}}}, "claims.u: Value error"),
        ({"version": 1, "claims": {"u": {**CLAIM, "pending": True, "mig": [[0]]}}}, "mig.0"),
        ({"version": 1, "claims": {"u": {**CLAIM, "devices": [{}], "spec": {}}}}, "devices.0"),
        ({"version": 7, "claims": {}}, "is not version 1"),
    ],
)
def test_a_checkpoint_of_the_wrong_shape_stops_the_start_in_one_line_naming_the_file(
    plugin: Plugin, checkpoint: object, where: str
) -> None:
    plugin.stop()
    path = plugin.state / CHECKPOINT_FILE
    path.write_text(json.dumps(checkpoint))
    with pytest.raises(GpuweaveError) as caught:
        plugin.start()
    message = str(caught.value)
    assert str(path) in message and where in message and "\n" not in message, message


def test_health_is_streamed_and_advertised() -> None:
    base = short_temp_dir()
    healthy = {"gpu-0": True, "gpu-1": True}

    def report() -> list[tuple[str, bool, str]]:
        return [(n, ok, "" if ok else "gpuweave.io/unhealthy=failed") for n, ok in healthy.items()]

    stream = HealthStream(report, pool=NODE, resend_s=30)
    preparer = ClaimPreparer(
        pool=NODE,
        state_dir=base,
        source=ApiClaims(),
        devices=lambda: (small_inventory(), dra_devices(small_inventory())),
        specs=ClaimSpecWriter(base / "cdi"),
        host=lambda: HOST,
    )
    server = DraPluginServer(preparer, kubelet_root=base / "kubelet", health=stream)
    server.start()
    try:
        registration = reg_grpc.RegistrationStub(grpc.insecure_channel(f"unix:{server.registration_path}"))
        info = registration.GetInfo(reg_pb2.InfoRequest(), timeout=10)
        assert "v1.DRAResourceHealth" in info.supported_versions
        watch = health_grpc.DRAResourceHealthStub(grpc.insecure_channel(f"unix:{server.socket_path}"))
        responses = watch.NodeWatchResources(health_pb2.NodeWatchResourcesRequest(), timeout=20)
        first = next(responses)
        assert {(d.device.pool_name, d.device.device_name, d.health) for d in first.devices} == {
            (NODE, "gpu-0", health_pb2.HEALTHY),
            (NODE, "gpu-1", health_pb2.HEALTHY),
        }
        assert all(d.health_check_timeout_seconds == 60 and d.last_updated_time > 0 for d in first.devices)
        stream.changed()  # nothing differs: nothing is sent
        healthy["gpu-1"] = False
        stream.changed()
        second = next(responses)
        bad = [d for d in second.devices if d.health == health_pb2.UNHEALTHY]
        assert [(d.device.device_name, d.message) for d in bad] == [("gpu-1", "gpuweave.io/unhealthy=failed")]
        responses.cancel()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_an_accepted_registration_calls_back() -> None:
    calls: list[int] = []
    service = RegistrationService(Path("/x/dra.sock"), on_registered=lambda: calls.append(1))
    service.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=False, error="e"), None)  # type: ignore[arg-type]
    service.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), None)  # type: ignore[arg-type]
    assert calls == [1]
