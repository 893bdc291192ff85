"""A loopback Kubernetes cluster for the e2e tests: the harness's real components plus ours.

``ControlPlane`` runs ``harness control-plane`` (embedded etcd + kube-apiserver) and applies
manifests with the real ``kubernetes`` client. ``SimNode`` runs ``harness node`` (the kubelet's
device manager and admission) next to ``gpuweave node-agent --simulate`` on the same kubelet
directory. ``start_scheduler`` runs the upstream kube-scheduler with the gpuweave-scheduler
profile from manifests/scheduler/, pointed at a ``gpuweave extender`` process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO / "tests" / "e2e" / "harness"
NAMESPACE = "gpuweave-system"
ALLOCATED_CONDITION = "e2e.gpuweave.io/DevicesAllocated"
SA_AUDIENCE = "https://kubernetes.default.svc"
T = TypeVar("T")


def harness_binary() -> Path:
    """The built harness, or a test failure that says how to build it (never a skip)."""
    path = Path(os.environ.get("GPUWEAVE_E2E_HARNESS", HARNESS_DIR / "bin" / "harness"))
    if not path.is_file():
        pytest.fail(
            f"e2e harness binary {path} is missing: build it with tests/e2e/harness/build.sh "
            "(Go >= 1.26, modules from the Go proxy; ~15 min cold) or set GPUWEAVE_E2E_HARNESS",
            pytrace=False,
        )
    return path


def gpuweave_command() -> list[str]:
    """Our CLI from the same virtualenv as the tests."""
    return [sys.executable, "-m", "gpuweave"]


def wait_for(what: str, check: Callable[[], T | None], *, timeout: float = 60.0, every: float = 0.2) -> T:
    """Poll ``check`` until it returns something other than None/False; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}", pytrace=False)
        time.sleep(every)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process whose output goes to a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self, name: str, argv: list[str], *, log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        full_env = {**os.environ, **(env or {})}
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def running(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.running():
            pytest.fail(
                f"{self.name} exited with {self.popen.returncode}; log:\n{self.tail()}", pytrace=False
            )

    def alive_and(self, check: Callable[[], bool]) -> bool:
        """``check()``, after failing the test if this process has died meanwhile."""
        self.check_alive()
        return check()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        if self.running():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        self._log.close()


class ControlPlane:
    """``harness control-plane`` and an admin client for it."""

    def __init__(self, work: Path) -> None:
        self.dir = work / "control-plane"
        self.dir.mkdir(parents=True)
        self.work = work
        self.process = Process(
            "control-plane", [str(harness_binary()), "control-plane", "--dir", str(self.dir)], log_dir=work
        )
        ready = self.dir / "ready"
        wait_for("kube-apiserver /readyz", lambda: self.process.alive_and(ready.exists), timeout=180)
        self.admin_kubeconfig = self.dir / "admin.kubeconfig"
        self.api: Any = config.new_client_from_config(config_file=str(self.admin_kubeconfig))  # type: ignore[no-untyped-call]
        self.core: Any = client.CoreV1Api(self.api)
        self.server = ready.read_text().strip()
        self.ca_file = self.dir / "pki" / "ca.crt"

    def stop(self) -> None:
        self.api.close()
        self.process.stop()

    def kustomize(self, directory: Path) -> list[dict[str, Any]]:
        """Render a kustomization with kustomize's library (``harness kustomize``)."""
        out = subprocess.run(
            [str(harness_binary()), "kustomize", str(directory)], check=True, capture_output=True, text=True
        ).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def apply(self, docs: list[dict[str, Any]], *, api: client.ApiClient | None = None) -> None:
        """Server-side apply each object, CRDs first (waiting until they are established)."""
        dyn = dynamic.DynamicClient(api or self.api)  # type: ignore[no-untyped-call]
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        for doc in crds + [d for d in docs if d["kind"] != "CustomResourceDefinition"]:
            self._apply_one(dyn, doc)
            if doc["kind"] == "CustomResourceDefinition":
                self._wait_established(dyn, doc["metadata"]["name"])

    @staticmethod
    def _apply_one(dyn: dynamic.DynamicClient, doc: dict[str, Any]) -> None:
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        meta = doc["metadata"]
        resource.server_side_apply(
            body=doc,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager="gpuweave-e2e",
            force_conflicts=True,
        )

    @staticmethod
    def _wait_established(dyn: dynamic.DynamicClient, name: str) -> None:
        crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")

        def established() -> bool:
            conditions = (crds.get(name=name).to_dict().get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(f"CRD {name} established", established, timeout=30)
        dyn.resources.invalidate_cache()

    def ensure_namespace(self, name: str) -> None:
        """A namespace with its default ServiceAccount (no controller-manager creates it here)."""
        with contextlib.suppress(ApiException):
            self.core.create_namespace({"metadata": {"name": name}})
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})

    def service_account_kubeconfig(self, name: str, *, namespace: str = NAMESPACE) -> Path:
        """A kubeconfig holding a TokenRequest token for the ServiceAccount (signed by the API server)."""
        request = {"spec": {"audiences": [SA_AUDIENCE], "expirationSeconds": 3600}}
        token = self.core.create_namespaced_service_account_token(name, namespace, request).status.token
        path = self.dir / f"sa-{namespace}-{name}.kubeconfig"
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": name}}],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(kubeconfig))
        return path

    def allocation_of(self, namespace: str, name: str) -> dict[str, Any] | None:
        """What the kubelet's device manager allocated to the pod (harness pod condition), if admitted."""
        pod = self.core.read_namespaced_pod(name, namespace)
        for condition in pod.status.conditions or []:
            if condition.type == ALLOCATED_CONDITION:
                return dict(json.loads(condition.message))
        return None


class SimNode:
    """A Node: ``harness node`` (kubelet device manager) + ``gpuweave node-agent --simulate``."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        name: str,
        profile: str,
        agent_kubeconfig: Path | None,
        health_config: Path | None = None,
        topology_policy: str = "none",
    ) -> None:
        self.name = name
        self.topology_policy = topology_policy
        self.plane = plane
        base = plane.work / "nodes" / name
        self.kubelet_dir = base / "kubelet"
        self.plugin_dir = self.kubelet_dir / "device-plugins"
        self.state_dir = base / "state"
        self.state_dir.mkdir(parents=True)
        self.kubelet_starts = 0
        self.kubelet = self._start_kubelet()
        wait_for(f"{name}'s device manager socket", self._kubelet_socket_ready, timeout=60)
        kube = ["--kubeconfig", str(agent_kubeconfig)] if agent_kubeconfig else ["--no-kube"]
        if health_config is not None:
            kube += ["--health-config", str(health_config)]
        self.agent = Process(
            f"node-agent-{name}",
            [
                *gpuweave_command(),
                "node-agent",
                "--simulate",
                profile,
                "--node-name",
                name,
                "--kubelet-dir",
                str(self.plugin_dir),
                "--state-dir",
                str(self.state_dir),
                *kube,
            ],
            log_dir=plane.work,
        )

    def _start_kubelet(self) -> Process:
        self.kubelet_starts += 1
        argv = [str(harness_binary()), "node", "--name", self.name]
        argv += ["--kubelet-dir", str(self.kubelet_dir), "--control-plane-dir", str(self.plane.dir)]
        argv += ["--topology-policy", self.topology_policy]
        return Process(f"kubelet-{self.name}-{self.kubelet_starts}", argv, log_dir=self.plane.work)

    def restart_kubelet(self) -> None:
        """Stop the node's kubelet side and start it again on the same directory (checkpoint kept)."""
        self.kubelet.stop()
        self.kubelet = self._start_kubelet()
        wait_for(f"{self.name}'s device manager socket", self._kubelet_socket_ready, timeout=60)

    def _kubelet_socket_ready(self) -> bool:
        self.kubelet.check_alive()
        return (self.plugin_dir / "kubelet.sock").exists()

    def node(self) -> Any:
        return self.plane.core.read_node(self.name)

    def wait_resource(self, resource: str, *, allocatable: int, timeout: float = 60) -> Any:
        """Wait until the Node's allocatable ``resource`` is ``allocatable`` (device manager → status)."""

        def check() -> Any:
            self.agent.check_alive()
            node = self.node()
            return node if (node.status.allocatable or {}).get(resource) == str(allocatable) else None

        return wait_for(f"{self.name} allocatable {resource}={allocatable}", check, timeout=timeout)

    def inject(self, *args: str) -> None:
        subprocess.run(
            [*gpuweave_command(), "sim", "inject", "--state-dir", str(self.state_dir), *args],
            check=True,
            capture_output=True,
            text=True,
        )

    def stop(self) -> None:
        self.agent.stop()
        self.kubelet.stop()


def render_scheduler_config(plane: ControlPlane, *, extender_url: str | None, kubeconfig: Path) -> Path:
    """manifests/scheduler/scheduler-config.yaml, adapted to this cluster.

    Only what differs between a pod and this loopback run changes: the client kubeconfig, no
    leader election, the extender's URL (or no extender, for the baseline).
    """
    source = yaml.safe_load((REPO / "manifests" / "scheduler" / "scheduler-config.yaml").read_text())
    source["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400}
    source["leaderElection"] = {"leaderElect": False}
    if extender_url is None:
        source.pop("extenders", None)
    else:
        for extender in source.get("extenders", []):
            extender["urlPrefix"] = extender_url
    path = plane.dir / ("scheduler-config.yaml" if extender_url else "scheduler-config-no-extender.yaml")
    path.write_text(yaml.safe_dump(source))
    return path


def start_scheduler(plane: ControlPlane, *, config_path: Path, name: str = "kube-scheduler") -> Process:
    return Process(
        name,
        [
            str(harness_binary()),
            "kube-scheduler",
            f"--config={config_path}",
            "--secure-port=0",
            f"--v={os.environ.get('GPUWEAVE_E2E_SCHEDULER_V', '2')}",
        ],
        log_dir=plane.work,
    )


def start_extender(plane: ControlPlane, *, kubeconfig: Path) -> tuple[Process, str]:
    """``gpuweave extender`` on a free loopback port; returns it once /readyz answers."""
    port = free_port()
    process = Process(
        "extender",
        [*gpuweave_command(), "extender", "--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig)],
        log_dir=plane.work,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for("extender /readyz", lambda: process.alive_and(lambda: _http_ok(f"{url}/readyz")), timeout=60)
    return process, url


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def stopping(*things: Any) -> Iterator[None]:
    try:
        yield
    finally:
        for thing in reversed(things):
            thing.stop()
