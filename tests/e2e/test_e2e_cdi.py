"""Every CDI name Allocate returns resolves with the CDI project's own library, as a runtime resolves it.

Real parts: the node agent's gRPC servers on unix sockets, the kubelet emulator asking Allocate,
the control socket for MIG reshapes, the production NVML and sysfs readers over a simulated DGX
H100 and p4d.24xlarge, the agent's spec writer, and ``tests/e2e/cdicheck`` (Go,
``tags.cncf.io/container-device-interface``) loading the spec directory and injecting each
container's CDI devices (its CRI list and its ``cdi.k8s.io`` annotations) into an OCI spec.
Build it with ``tests/e2e/cdicheck/build.sh`` (seconds; the harness build runs it too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU, RESOURCE_GPU_SHARED, mig_resource_name
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.mig import build_mig_service, register_mig_routes
from hardware.device_nodes import HostDeviceNodes, read_host_device_nodes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.allocation import DeviceListing, DeviceListStrategy
from nodeagent.cdi import CdiPublisher, CdiSpecWriter
from nodeagent.control import call_agent
from nodeagent.devices import DeviceKind
from proto.v1beta1 import api_pb2
from tests.e2e.cluster import REPO
from tests.support.control_plane import built_binary
from tests.support.kubelet_emulator import KubeletEmulator

pytestmark = pytest.mark.e2e

CDICHECK = REPO / "tests" / "e2e" / "cdicheck" / "bin" / "cdicheck"
MIG_3G = mig_resource_name("3g.40gb")
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
ALL_STRATEGIES = frozenset(DeviceListStrategy)
CDI_BY_ID = (DeviceKind.GPU, DeviceKind.MIG, DeviceKind.EFA)  # shares are named by their GPU


@dataclass
class Node:
    agent: NodeAgent
    kubelet: KubeletEmulator
    backend: SimulatedBackend
    state_dir: Path
    spec_dir: Path
    listed_undefined: list[str]  # ListedDevicesCheck's findings

    def allocate(self, resource: str, per_container: list[list[str]]) -> list[dict[str, Any]]:
        """One Allocate for ``per_container``; each container as cdicheck takes it."""
        requests = [api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in per_container]
        response = self.kubelet.stub(resource).Allocate(
            api_pb2.AllocateRequest(container_requests=requests), timeout=10
        )
        return [
            {"devices": [c.name for c in r.cdi_devices], "annotations": dict(r.annotations)}
            for r in response.container_responses
        ]


def resolve(spec_dir: Path, containers: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """cdicheck's exit status and report for these containers."""
    cdicheck = built_binary(
        CDICHECK, env="GPUWEAVE_CDICHECK", what="cdicheck binary", build="tests/e2e/cdicheck/build.sh"
    )
    request = json.dumps({"specDir": str(spec_dir), "containers": containers})
    done = subprocess.run(
        [str(cdicheck)], check=False, input=request, capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, report


def paths(container: dict[str, Any]) -> list[str]:
    return [n["path"] for n in container["deviceNodes"]]


NodeFactory = Callable[..., Node]


class ListedDevicesCheck:
    """The publisher's host reader, with a check: each time the agent prepares a spec change it
    first compares, in the agent's own thread and under its lock, the devices every resource lists
    now with the names the specs on disk define now. An agent that changed a list before writing
    the spec would be caught here listing a name no spec defines."""

    def __init__(self, spec_dir: Path, root: Path) -> None:
        self.spec_dir, self.root = spec_dir, root
        self.agent: NodeAgent | None = None
        self.undefined: list[str] = []

    def _on_disk(self) -> set[str]:
        specs = [json.loads(p.read_text()) for p in self.spec_dir.glob("gpuweave-*.json")]
        return {f"{spec['kind']}={d['name']}" for spec in specs for d in spec["devices"]}

    def __call__(self) -> HostDeviceNodes:
        if self.agent is not None:
            defined = self._on_disk()
            for resource in self.agent.resource_names():
                for device in self.agent.state_of(resource).devices().values():
                    kind = "vpc.amazonaws.com/efa" if device.kind is DeviceKind.EFA else "nvidia.com/gpu"
                    name = f"{kind}={device.id if device.kind in CDI_BY_ID else device.gpu_uuid}"
                    if name not in defined:
                        self.undefined.append(f"{resource} lists {name}")
        return read_host_device_nodes(self.root)


@pytest.fixture
def start_node() -> Iterator[NodeFactory]:
    made: list[tuple[Node, Path]] = []

    def start(
        profile: str, *, sharing: SharingPlan | None = None, stale: dict[str, str] | None = None
    ) -> Node:
        root = Path(tempfile.mkdtemp(prefix="gwcdi", dir="/tmp"))
        kubelet_dir, state_dir, spec_dir = root / "k", root / "s", root / "cdi"
        spec_dir.mkdir()
        for name, text in (stale or {}).items():  # what an earlier run left
            (spec_dir / name).write_text(text)
        kubelet = KubeletEmulator(kubelet_dir)
        kubelet.start()
        backend = SimulatedBackend(load_profile(profile), root / "host")
        host = read_host_device_nodes(backend.sysfs_root)
        listing = DeviceListing(
            strategies=ALL_STRATEGIES, rdma_cm=host.rdma_cm.path if host.rdma_cm else None
        )
        config = AgentConfig(
            kubelet_dir=kubelet_dir,
            state_dir=state_dir,
            sharing=sharing or SharingPlan(),
            device_listing=listing,
        )
        watch = ListedDevicesCheck(spec_dir, backend.sysfs_root)
        agent = device_plugin_agent(
            config, discover=backend.discover, cdi=CdiPublisher(CdiSpecWriter(spec_dir), host=watch)
        )
        watch.agent = agent
        mig = build_mig_service(agent, backend=backend, state_dir=state_dir, inventory=backend.discover())
        mig.start()
        agent.start()
        register_mig_routes(agent, mig)
        node = Node(agent, kubelet, backend, state_dir, spec_dir, watch.undefined)
        made.append((node, root))
        return node

    yield start
    for node, root in made:
        node.agent.stop()
        node.kubelet.stop()
        node.backend.close()
        shutil.rmtree(root, ignore_errors=True)


def test_cdi_dgx_h100_every_name_resolves_before_and_after_a_mig_reshape(start_node: NodeFactory) -> None:
    node = start_node("dgx-h100")
    kubelet, inventory = node.kubelet, node.backend.inventory
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 8)
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    held = [g for g in gpus if g.index != 3]  # GPU 3 stays idle: a held GPU is never reshaped
    containers = node.allocate(RESOURCE_GPU, [[g.uuid] for g in held])
    status, report = resolve(node.spec_dir, containers)
    assert (status, report["specErrors"]) == (0, {})
    assert all(v["version"] == v["minimum"] for v in report["specs"].values())  # the lowest that fits
    for gpu, asked, got in zip(held, containers, report["containers"], strict=True):
        assert asked["devices"] == [f"nvidia.com/gpu={gpu.uuid}"]
        assert asked["annotations"]["cdi.k8s.io/gpuweave_nvidia.com_gpu"] == asked["devices"][0]
        assert sorted(paths(got)) == sorted([*CONTROL, gpu.device_node])
    assert f"nvidia.com/gpu={gpus[3].uuid}" in report["devices"]

    reshape = call_agent(
        node.state_dir, "mig.apply", {"gpu": 3, "profiles": ["3g.40gb", "3g.40gb"]}, timeout=60
    )
    migs = [c["uuid"] for c in reshape["created"]]
    # As soon as the kubelet sees the new devices, a runtime resolves them (the spec came first).
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_3G)) == 2)
    containers = node.allocate(MIG_3G, [[uuid] for uuid in migs])
    status, report = resolve(node.spec_dir, containers)
    assert (status, report["specErrors"]) == (0, {})
    for container in report["containers"]:
        nodes = paths(container)
        caps = [p for p in nodes if p.startswith("/dev/nvidia-caps/")]
        assert "/dev/nvidia3" in nodes and len(caps) == 2 and set(CONTROL) <= set(nodes)

    # No list the kubelet could have seen named a device before the specs defined it.
    assert node.listed_undefined == []

    # GPU 3 is no longer served whole: its name is gone, and a runtime refuses it.
    status, report = resolve(node.spec_dir, [{"devices": [f"nvidia.com/gpu={gpus[3].uuid}"]}])
    assert status == 1
    assert report["containers"][0]["unresolved"] == [f"nvidia.com/gpu={gpus[3].uuid}"]
    assert f"nvidia.com/gpu={gpus[3].uuid}" not in report["devices"]


def test_cdi_p4d_efa_adapters_gpus_and_shares_resolve(start_node: NodeFactory) -> None:
    sharing = SharingPlan(per_gpu={"0": GpuSharing(SharingMode.TIME_SLICED, replicas=4)})
    node = start_node("p4d.24xlarge", sharing=sharing)
    kubelet = node.kubelet
    wanted = {RESOURCE_EFA: 4, RESOURCE_GPU: 7, RESOURCE_GPU_SHARED: 4}  # GPU 0 is offered as 4 replicas
    assert kubelet.wait_for(
        lambda: all(r in kubelet.resources() and len(kubelet.devices(r)) == n for r, n in wanted.items())
    )
    adapters = sorted(kubelet.devices(RESOURCE_EFA))
    gpus = sorted(kubelet.devices(RESOURCE_GPU))[:2]
    replica = sorted(kubelet.devices(RESOURCE_GPU_SHARED))[0]
    containers = (
        node.allocate(RESOURCE_EFA, [adapters])
        + node.allocate(RESOURCE_GPU, [gpus])
        + node.allocate(RESOURCE_GPU_SHARED, [[replica]])
    )
    status, report = resolve(node.spec_dir, containers)
    assert (status, report["specErrors"]) == (0, {})
    efa, whole, shared = report["containers"]
    verbs = sorted(node.backend.inventory.nics, key=lambda n: n.name)
    assert sorted(paths(efa)) == sorted([str(n.uverbs_device) for n in verbs] + ["/dev/infiniband/rdma_cm"])
    assert len([p for p in paths(whole) if p.startswith("/dev/nvidia") and p[11:].isdigit()]) == 2
    assert "/dev/nvidia0" in paths(shared)  # GPU 0's replicas name GPU 0
    assert node.listed_undefined == []


def test_cdi_specs_from_an_earlier_run_are_replaced_at_start(start_node: NodeFactory) -> None:
    stale = {
        "gpuweave-nvidia.com-gpu.json": json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [{"name": "GPU-gone", "containerEdits": {}}],
            }
        ),
        "other-vendor.json": json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "example.com/thing",
                "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}],
            }
        ),
    }
    node = start_node("dgx-h100", stale=stale)
    assert node.kubelet.wait_for(lambda: len(node.kubelet.devices(RESOURCE_GPU)) == 8)
    status, report = resolve(
        node.spec_dir, [{"devices": ["nvidia.com/gpu=GPU-gone"]}, {"devices": ["example.com/thing=a"]}]
    )
    assert status == 1
    assert report["containers"][0]["unresolved"] == ["nvidia.com/gpu=GPU-gone"]
    assert report["containers"][1]["env"] == ["A=1"]  # another tool's spec is left alone
    assert len([d for d in report["devices"] if d.startswith("nvidia.com/gpu=")]) == 8
