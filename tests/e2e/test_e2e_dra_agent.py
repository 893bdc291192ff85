"""`gpuweave node-agent --dra` as a real process against the real kube-apiserver, with a Python gRPC
client in the kubelet's place (the harness has no kubelet DRA manager yet): the agent publishes its
pool, serves no device-plugin resource, registers as DRAPlugin, prepares a claim the admin allocated
(CDI spec written), keeps it across a restart, and taints a GPU after Xid 79 until it is healthy.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proto.dra.health.v1 import api_pb2 as health_pb2
from proto.dra.health.v1 import api_pb2_grpc as health_grpc
from proto.dra.v1 import api_pb2 as dra_pb2
from proto.dra.v1 import api_pb2_grpc as dra_grpc
from proto.pluginregistration.v1 import api_pb2 as reg_pb2
from proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.e2e.cluster import REPO, ControlPlane, Process, gpuweave_command, wait_for

pytestmark = pytest.mark.e2e

NODE = "e2e-dra-agent"
NAMESPACE = "e2e-dra"


class DraAgent:
    def __init__(
        self,
        plane: ControlPlane,
        kubeconfig: Path,
        *,
        node: str = NODE,
        profile: str = "p5.48xlarge",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.node, self.profile, self.extra = node, profile, extra
        base = plane.work / f"dra-{node}"
        self.kubelet = base / "kubelet"
        (self.kubelet / "device-plugins").mkdir(parents=True)
        self.state = base / "state"
        self.state.mkdir()
        self.health = base / "health.yaml"
        self.health.write_text(yaml.safe_dump({"health": {"round_interval_s": 1, "startup_rounds": 1}}))
        self.plane, self.kubeconfig = plane, kubeconfig
        self.starts = 0
        self.process = self.start()

    def start(self) -> Process:
        self.starts += 1
        argv = [*gpuweave_command(), "node-agent", "--simulate", self.profile, "--node-name", self.node]
        argv += ["--kubelet-dir", str(self.kubelet / "device-plugins"), "--state-dir", str(self.state)]
        argv += [
            "--kubeconfig",
            str(self.kubeconfig),
            "--health-config",
            str(self.health),
            "--dra",
            *self.extra,
        ]
        return Process(f"dra-{self.node}-{self.starts}", argv, log_dir=self.plane.work)

    @property
    def registration(self) -> Path:
        return self.kubelet / "plugins_registry" / "gpuweave.io-reg.sock"

    def dra(self) -> Any:
        return dra_grpc.DRAPluginStub(
            grpc.insecure_channel(f"unix:{self.kubelet}/plugins/gpuweave.io/dra.sock")
        )

    def inject(self, *flags: str) -> None:
        command = [*gpuweave_command(), "sim", "inject", "--state-dir", str(self.state), *flags]
        subprocess.run(command, check=True, cwd=REPO, capture_output=True, timeout=60)


def _create_node(plane: ControlPlane, name: str) -> None:
    """A Node no kubelet runs: cordoned and tainted, so the session's other tests schedule nothing
    onto it; removed with its published inventory when the module ends (``_remove_node``)."""
    taint = {"key": "e2e.gpuweave.io/dra-agent-only", "effect": "NoSchedule"}
    plane.core.create_node({"metadata": {"name": name}, "spec": {"unschedulable": True, "taints": [taint]}})


def _remove_node(plane: ControlPlane, name: str) -> None:
    with contextlib.suppress(ApiException):
        plane.core.delete_node(name)
    with contextlib.suppress(ApiException):
        client.CustomObjectsApi(plane.api).delete_cluster_custom_object(
            "gpuweave.io", "v1alpha1", "gpunodeinventories", name
        )
    for item in slices(plane, name):
        with contextlib.suppress(ApiException):
            client.ResourceV1Api(plane.api).delete_resource_slice(item.metadata.name)


@pytest.fixture(scope="module")
def agent(plane: ControlPlane) -> Iterator[DraAgent]:
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    _create_node(plane, NODE)
    plane.ensure_namespace(NAMESPACE)
    started = DraAgent(plane, plane.service_account_kubeconfig("gpuweave-node-agent"))
    try:
        yield started
    finally:
        started.process.stop()
        _remove_node(plane, NODE)


def slices(plane: ControlPlane, node: str = NODE) -> list[Any]:
    found = client.ResourceV1Api(plane.api).list_resource_slice(field_selector=f"spec.nodeName={node}")
    return list(found.items)


def published_device(plane: ControlPlane, device: str, node: str = NODE) -> Any:
    for item in slices(plane, node):
        for d in item.spec.devices or []:
            if d.name == device:
                return d
    return None


def taints_of(plane: ControlPlane, device: str) -> list[str] | None:
    """The device's taint effects; None while the pool does not list it."""
    found = published_device(plane, device)
    return None if found is None else [t.effect for t in found.taints or []]


def _allocated_claim(
    plane: ControlPlane, name: str, device: str, *, node: str = NODE, klass: str = "gpu"
) -> str:
    resource = client.ResourceV1Api(plane.api)
    body = {
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuweave.io"}}]}
        },
    }
    created = resource.create_namespaced_resource_claim(NAMESPACE, body)
    result = {"request": "gpu", "driver": "gpuweave.io", "pool": node, "device": device}
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    resource.patch_namespaced_resource_claim_status(name, NAMESPACE, status)
    return str(created.metadata.uid)


def test_dra_agent_publishes_its_pool_and_registers(agent: DraAgent) -> None:
    plane = agent.plane
    published = wait_for("the agent's ResourceSlices", lambda: slices(plane) or None, timeout=90)
    devices = [d for s in published for d in s.spec.devices or []]
    assert len(devices) == 8 + 32 and {s.spec.pool.name for s in published} == {NODE}
    assert published[0].metadata.owner_references[0].kind == "Node"
    wait_for("the registration socket", agent.registration.exists, timeout=30)
    info = reg_grpc.RegistrationStub(grpc.insecure_channel(f"unix:{agent.registration}")).GetInfo(
        reg_pb2.InfoRequest(), timeout=10
    )
    assert (info.type, info.name) == ("DRAPlugin", "gpuweave.io")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"]
    assert not list((agent.kubelet / "device-plugins").glob("gpuweave-*.sock"))  # no device-plugin resource


def test_dra_agent_prepares_a_claim_and_keeps_it_across_a_restart(agent: DraAgent) -> None:
    wait_for("the agent's ResourceSlices", lambda: slices(agent.plane) or None, timeout=90)
    uid = _allocated_claim(agent.plane, "one-gpu", "gpu-2")
    request = dra_pb2.NodePrepareResourcesRequest(
        claims=[dra_pb2.Claim(uid=uid, namespace=NAMESPACE, name="one-gpu")]
    )
    first = agent.dra().NodePrepareResources(request, timeout=30).claims[uid]
    assert first.error == "" and [d.device_name for d in first.devices] == ["gpu-2"]
    spec = json.loads((agent.state / "cdi" / f"gpuweave.io-claim_{uid}.json").read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia2"
    agent.process.stop()
    agent.process = agent.start()
    wait_for("the restarted agent's DRA socket", (agent.kubelet / "plugins/gpuweave.io/dra.sock").exists)
    deadline = time.monotonic() + 60
    while True:
        try:
            again = agent.dra().NodePrepareResources(request, timeout=10).claims[uid]
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert again == first
    unprepare = dra_pb2.NodeUnprepareResourcesRequest(claims=request.claims)
    assert agent.dra().NodeUnprepareResources(unprepare, timeout=30).claims[uid].error == ""
    assert not (agent.state / "cdi" / f"gpuweave.io-claim_{uid}.json").exists()


def _seen_taint(plane: ControlPlane, device: str, effects: set[str]) -> set[str]:
    seen: set[str] = set()

    def found() -> bool:
        seen.update(taints_of(plane, device) or [])
        return bool(seen & effects)

    wait_for(f"a {' or '.join(sorted(effects))} taint on {device}", found, timeout=60, every=0.1)
    return seen


def test_dra_agent_taints_a_gpu_no_execute_after_xid_79(agent: DraAgent) -> None:
    plane = agent.plane
    wait_for("the agent's ResourceSlices", lambda: slices(plane) or None, timeout=90)
    wait_for("the agent's control socket", (agent.state / "agent.sock").exists, timeout=60)
    agent.inject("--gpu", "5", "--xid", "79")
    _seen_taint(plane, "gpu-5", {"NoExecute"})
    assert taints_of(plane, "gpu-4") == []  # siblings untouched
    time.sleep(3)
    assert taints_of(plane, "gpu-5") == ["NoExecute"]  # off the bus: it stays tainted, listed
    stream = health_grpc.DRAResourceHealthStub(
        grpc.insecure_channel(f"unix:{agent.kubelet}/plugins/gpuweave.io/dra.sock")
    )
    responses = stream.NodeWatchResources(health_pb2.NodeWatchResourcesRequest(), timeout=30)
    health = {d.device.device_name: d for d in next(responses).devices}
    responses.cancel()
    assert len(health) == 40 and health["gpu-4"].health == health_pb2.HEALTHY
    assert health["gpu-5"].health == health_pb2.UNHEALTHY
    assert health["gpu-5"].message.startswith("gpuweave.io/unhealthy=")


def test_dra_agent_untaints_a_gpu_after_probation(agent: DraAgent) -> None:
    plane = agent.plane
    wait_for("the agent's control socket", (agent.state / "agent.sock").exists, timeout=60)
    agent.inject("--gpu", "2", "--nvml-hang", "4")
    _seen_taint(plane, "gpu-2", {"NoSchedule", "NoExecute"})
    wait_for(
        "gpu-2 listed and untainted after probation", lambda: taints_of(plane, "gpu-2") == [], timeout=90
    )


@pytest.fixture(scope="module")
def mig_agent(agent: DraAgent) -> Iterator[DraAgent]:
    plane = agent.plane
    _create_node(plane, "e2e-dra-mig")
    extra = ("--dra-mig", "dynamic", "--pod-resources-socket", "none")
    started = DraAgent(plane, agent.kubeconfig, node="e2e-dra-mig", profile="dgx-h100", extra=extra)
    try:
        yield started
    finally:
        started.process.stop()
        _remove_node(plane, "e2e-dra-mig")


def _uuid_of(plane: ControlPlane, device: str) -> str | None:
    found = published_device(plane, device, "e2e-dra-mig")
    if found is None:
        return None
    value = (found.attributes or {}).get("uuid")
    return value.string if value is not None else ""


def test_dra_agent_makes_a_mig_instance_at_prepare_and_removes_it_at_unprepare(mig_agent: DraAgent) -> None:
    plane, placement = mig_agent.plane, "gpu-1-mig-3g-40gb-4"
    wait_for(
        f"{placement} published without an instance", lambda: _uuid_of(plane, placement) == "", timeout=90
    )
    uid = _allocated_claim(plane, "mig-half", placement, node="e2e-dra-mig", klass="mig")
    claims = [dra_pb2.Claim(uid=uid, namespace=NAMESPACE, name="mig-half")]
    answer = mig_agent.dra().NodePrepareResources(
        dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=45
    )
    assert answer.claims[uid].error == "" and answer.claims[uid].devices[0].device_name == placement
    spec = json.loads((mig_agent.state / "cdi" / f"gpuweave.io-claim_{uid}.json").read_text())
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia1" and any(p.startswith("/dev/nvidia-caps/") for p in nodes)
    assert spec["containerEdits"]["env"][0].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
    wait_for(
        "the instance's uuid in the slice", lambda: (_uuid_of(plane, placement) or "").startswith("MIG-")
    )
    unprepare = dra_pb2.NodeUnprepareResourcesRequest(claims=claims)
    assert mig_agent.dra().NodeUnprepareResources(unprepare, timeout=45).claims[uid].error == ""
    wait_for("the instance removed from the slice", lambda: _uuid_of(plane, placement) == "", timeout=60)
    assert not (mig_agent.state / "cdi" / f"gpuweave.io-claim_{uid}.json").exists()
