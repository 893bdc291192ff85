"""One real node for the realnode tier: ``harness realnode`` (the full kubelet, containerd, runc)
with the e2e images imported, and what its containers report.

The images are built here from ``tests/e2e/realnode/bin/seer`` (static, built by
tests/e2e/realnode/build.sh): ``gpuweave.test/seer:1`` prints what its container sees and waits,
``gpuweave.test/pause:1`` is every pod's sandbox. Container logs are read from the kubelet's
``podLogsDir`` (CRI log format), so a test reads what the process inside printed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes.client.exceptions import ApiException

from hardware.device_nodes import CharDevice, read_host_device_nodes
from hardware.profiles import load_profile
from hardware.simulated.node import SimulatedNode
from hardware.simulated.sysfs_tree import write_fake_sysfs
from proto.podresources.v1 import api_pb2, api_pb2_grpc
from release.image import build_image
from release.oci_image import ImageFile, write_image_archive
from tests.e2e.pods import inventory
from tests.support.control_plane import REPO, ControlPlane, Process, wait_for

REALNODE_DIR = REPO / "tests" / "e2e" / "realnode"
BIN_DIR = REALNODE_DIR / "bin"
SEER_IMAGE = "gpuweave.test/seer:1"
PAUSE_IMAGE = "gpuweave.test/pause:1"
SEER_MARKER = "GPUWEAVE-SEER "
# Other tests' schedulers must not place pods on the real node; its pods tolerate this.
# The node's directory holds unix sockets (the kubelet's, the device plugins', containerd's): a
# pytest base directory is too long for them once its counter grows (pytest-1000/...), so the
# node lives under a short root and the plane's work directory links to it (realnodes/NAME).
SHORT_ROOT = Path("/tmp/gwrn")
REALNODE_TAINT = {"key": "e2e.gpuweave.io/realnode", "value": "only", "effect": "NoSchedule"}


AGENT_IMAGE = "gpuweave.test/gpuweave:dev"


def build_agent_image(out: Path) -> Path:
    """``gpuweave.test/gpuweave:dev``: the release image (``release.image``, as scripts/build-image
    builds it) over the base layer tests/e2e/realnode/build.sh built (release/image-base.sh)."""
    base = realnode_binaries() / "agent-base.tar"
    if not base.exists():
        raise RuntimeError(f"{base} is missing: run tests/e2e/realnode/build.sh (scripts/test runs it)")
    path = out / "gpuweave-dev.tar"
    build_image(path, name=AGENT_IMAGE, base=base)
    return path


def realnode_binaries() -> Path:
    """The tier's node software, or a failure that says how to build it."""
    missing = [
        n
        for n in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "seer")
        if not (BIN_DIR / n).exists()
    ]
    if missing:
        raise RuntimeError(
            f"{BIN_DIR} lacks {', '.join(missing)}: run tests/e2e/realnode/build.sh (scripts/test runs it)"
        )
    return BIN_DIR


def build_images(out: Path) -> list[Path]:
    """The seer and pause image archives (same bytes on every machine for the same seer binary)."""
    seer = {"seer": ImageFile(realnode_binaries() / "seer")}
    images = [(SEER_IMAGE, ["/seer", "report"]), (PAUSE_IMAGE, ["/seer", "pause"])]
    paths = []
    for name, entrypoint in images:
        path = out / (name.split("/")[-1].replace(":", "-") + ".tar")
        write_image_archive(path, name=name, files=seer, entrypoint=entrypoint)
        paths.append(path)
    return paths


def simulated_device_nodes(profile: str, out: Path) -> Path:
    """The device nodes a host with ``profile``'s hardware has, with the numbers the simulated
    tree gives them (the node agent's simulated NVML and sysfs agree): a JSON list for ``harness
    realnode --device-nodes``, which creates them as character devices under the node's /dev."""
    root = out / "sim-host"
    node = SimulatedNode.from_profile(load_profile(profile))
    write_fake_sysfs(root, node)
    host = read_host_device_nodes(root)
    devices: list[CharDevice] = [*host.control, *(host.gpu_node(g.minor) for g in node.inventory.gpus)]
    devices += host.uverbs.values()
    devices += [host.rdma_cm] if host.rdma_cm else []
    if host.caps_major is not None:
        minors = sorted(set(host.mig_minors.values()))
        devices += [CharDevice(f"/dev/nvidia-caps/nvidia-cap{m}", host.caps_major, m) for m in minors]
    path = out / "device-nodes.json"
    path.write_text(json.dumps([{"path": d.path, "major": d.major, "minor": d.minor} for d in devices]))
    return path


def fresh_dir(parent: Path, name: str) -> Path:
    """``parent/name``, or ``name-2``, ``-3``... when a node of that name ran before in this session
    (the chart, upgrade and uninstall modules each start the chart's node in turn)."""
    parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 100):
        path = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RuntimeError(f"too many nodes named {name} under {parent}")


def node_dir(plane_work: Path, name: str) -> Path:
    """A fresh directory for the node ``name`` of the plane working in ``plane_work``."""
    root = SHORT_ROOT / hashlib.sha256(str(plane_work).encode()).hexdigest()[:8]
    path = fresh_dir(root, name)
    links = plane_work / "realnodes"
    links.mkdir(parents=True, exist_ok=True)
    (links / path.name).symlink_to(path)
    return path


class RealNode:
    """``harness realnode``: a Node whose kubelet and container runtime are the real ones."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        name: str,
        kubelet_port: int,
        profile: str,
        taints: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        agent_image: bool = False,
        more_images: Sequence[Path] = (),
    ) -> None:
        """``profile``: the simulated hardware whose device nodes the node's /dev holds;
        ``agent_image``: also import the node agent's image and route the kubernetes Service's
        address to the API server, for the chart's DaemonSet; ``more_images``: image archives to
        import as well."""
        self.name = name
        self.agent: Process | None = None
        self.agent_handle: Any = None  # the test module's handle on the node agent
        self.plane = plane
        self.dir = node_dir(plane.work, name)
        self.kubelet_dir = self.dir / "kubelet"
        self.plugin_dir = self.kubelet_dir / "device-plugins"
        self.cdi_dir = self.dir / "cdi"
        images = build_images(self.dir) + ([build_agent_image(self.dir)] if agent_image else [])
        images += more_images
        argv = [str(plane.harness), "realnode", "--name", name, "--dir", str(self.dir)]
        argv += ["--control-plane-dir", str(plane.dir), "--bin-dir", str(realnode_binaries())]
        argv += ["--images", ",".join(str(p) for p in images), "--kubelet-port", str(kubelet_port)]
        argv += ["--device-nodes", str(simulated_device_nodes(profile, self.dir))]
        if labels:
            argv += ["--node-labels", ",".join(f"{k}={v}" for k, v in labels.items())]
        if agent_image:
            argv += ["--kubernetes-service"]
        if taints:
            argv += ["--register-with-taints", f"{taints['key']}={taints['value']}:{taints['effect']}"]
        self.process = Process(f"realnode-{name}", argv, log_dir=plane.work)
        ready, socket = self.dir / "ready", self.plugin_dir / "kubelet.sock"
        try:
            wait_for(
                f"{name}: containerd up, images imported",
                lambda: self.process.alive_and(ready.exists),
                timeout=120,
            )
            wait_for(
                f"{name}'s device manager socket", lambda: self.process.alive_and(socket.exists), timeout=60
            )
        except BaseException:
            self.stop()
            raise

    def restart_kubelet(self) -> None:
        """The kubelet alone stops and starts again (containerd and the containers keep running)."""
        socket = self.plugin_dir / "kubelet.sock"
        before = socket.stat().st_ctime_ns
        self.process.popen.send_signal(signal.SIGHUP)

        def new_socket() -> bool:  # the device manager removes and binds its socket at start
            try:
                return socket.stat().st_ctime_ns > before
            except FileNotFoundError:
                return False

        wait_for(
            f"{self.name}'s restarted kubelet socket", lambda: self.process.alive_and(new_socket), timeout=60
        )

    def log(self, component: str) -> str:
        return (self.dir / "logs" / f"{component}.log").read_text(errors="replace")

    def container_output(self, pod: Any, container: str) -> list[str]:
        """Lines the container wrote to stdout/stderr (its current log file, CRI format)."""
        base = (
            self.dir
            / "logs"
            / "pods"
            / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid}"
            / container
        )
        lines: list[str] = []
        for path in sorted(base.glob("*.log")):
            for raw in path.read_text(errors="replace").splitlines():
                parts = raw.split(" ", 3)  # <time> <stream> <P|F> <text>
                if len(parts) == 4:
                    lines.append(parts[3])
        return lines

    def seen(self, pod: Any, container: str = "main") -> dict[str, Any] | None:
        """What seer printed in the container, or None before it has."""
        for line in self.container_output(pod, container):
            if line.startswith(SEER_MARKER):
                return dict(json.loads(line[len(SEER_MARKER) :]))
        return None

    def stop(self) -> None:
        """Stop the node and forget it, as when a node leaves (no garbage collector runs here):
        its Node, ResourceSlices and GpuNodeInventory are deleted so later tests do not see it.
        Once the harness has cleaned up after itself, the node's directory keeps its logs only."""
        self.process.stop(timeout=60)
        self.plane.forget_node(self.name)
        if self.process.popen.returncode == 0:  # killed instead: its containers may still be there
            shed_all_but_logs(self.dir)


def shed_all_but_logs(directory: Path) -> None:
    """Remove what a stopped node left in ``directory`` (image archives, containerd's content and
    snapshots, the kubelet's directory: about 0.8 GB a node, which outlives pytest's own clean-up of
    its temporary directories since it lies under ``SHORT_ROOT``) except ``logs``."""
    for entry in directory.iterdir():
        if entry.name == "logs":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# ---- seer pods: what a container on the real node saw ------------------------------------------
SEER_NAMESPACE = "e2e-realnode"
SEER_SCHEDULER = "gpuweave-realnode"
NVIDIA_MAJOR = 195


def seer_pod(name: str, limits: dict[str, str], node: str) -> dict[str, Any]:
    """A seer pod for the real node ``node``: it tolerates the node's taint and selects the node,
    since the session's simulated nodes (other modules) would fit it too."""
    toleration = {**REALNODE_TAINT, "operator": "Equal"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SEER_SCHEDULER,
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "tolerations": [toleration],
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": SEER_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def run_seer(node: RealNode, name: str, limits: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """Create the pod, wait until it runs and its container has reported; (pod, report)."""
    node.plane.core.create_namespaced_pod(SEER_NAMESPACE, seer_pod(name, limits, node.name))
    return wait_reported(node, name)


def wait_reported(node: RealNode, name: str) -> tuple[Any, dict[str, Any]]:
    """The pod once it runs and its container has reported; (pod, report)."""

    def reported() -> tuple[Any, dict[str, Any]] | None:
        node.process.check_alive()
        pod = node.plane.core.read_namespaced_pod(name, SEER_NAMESPACE)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed: {pod.status.reason}: {pod.status.message}", pytrace=False)
        if pod.status.phase != "Running":
            return None
        seen = node.seen(pod)
        return (pod, seen) if seen is not None else None

    def state() -> str:
        pod = node.plane.core.read_namespaced_pod(name, SEER_NAMESPACE)
        statuses = [(c.name, c.state) for c in pod.status.container_statuses or []]
        return (
            f"pod {name} on node {pod.spec.node_name!r}, phase {pod.status.phase}, containers {statuses}, "
            f"conditions {[(c.type, c.status, c.message) for c in pod.status.conditions or []]}"
        )

    return wait_for(f"pod {name} running and its container's report", reported, timeout=120, seen=state)


def delete_pod(node: RealNode, name: str) -> None:
    try:
        node.plane.core.delete_namespaced_pod(name, SEER_NAMESPACE, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
    wait_for(f"pod {name} gone", lambda: pod_or_none(node, name) is None, timeout=60)


def pod_or_none(node: RealNode, name: str) -> Any:
    try:
        return node.plane.core.read_namespaced_pod(name, SEER_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def gpu_nodes(seen: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """/dev/nvidia<N> nodes the container has, with their device numbers."""
    out = {}
    for device in seen["devices"]:
        tail = device["path"].removeprefix("/dev/nvidia")
        if device["path"].startswith("/dev/nvidia") and tail.isdigit():
            out[device["path"]] = (device["major"], device["minor"])
    return out


def allowed_gpu_minors(seen: dict[str, Any]) -> set[int]:
    """GPU minors the container's device cgroup lets it open (``c 195:N rw``; control nodes aside)."""
    minors = set()
    for rule in seen["deviceCgroup"]:
        kind, numbers, _ = rule.split(" ")
        major, minor = numbers.split(":")
        if kind == "c" and major == str(NVIDIA_MAJOR) and minor.isdigit() and int(minor) < 254:
            minors.add(int(minor))
    return minors


def gpus_by_uuid(node: RealNode) -> dict[str, dict[str, Any]]:
    return {g["uuid"]: g for g in inventory(node.plane, node.name)["spec"]["gpus"]}


def container_id(pod: Any) -> str:
    (status,) = pod.status.container_statuses
    assert status.state.running is not None, status.state
    return str(status.container_id)


def allocatable_ids(node: RealNode, resource: str) -> set[str]:
    """The kubelet's pod-resources GetAllocatableResources for ``resource``: every device ID the
    device manager holds from the plugins' ListAndWatch."""
    socket = node.kubelet_dir / "pod-resources" / "kubelet.sock"
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        answer = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=10)
    return {i for d in answer.devices if d.resource_name == resource for i in d.device_ids}


def delete_all_pods(node: RealNode) -> None:
    """Delete every pod in the seer namespace and wait until each is gone."""
    for pod in node.plane.core.list_namespaced_pod(SEER_NAMESPACE).items:
        delete_pod(node, pod.metadata.name)
