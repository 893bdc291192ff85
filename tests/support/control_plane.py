"""The real Kubernetes control plane for tests: ``harness control-plane`` and an admin client.

The e2e suite and the transport tests that need a real kube-apiserver share this start-up.
The harness binary is built by tests/e2e/harness/build.sh (CI builds it before the tests); a
missing binary fails the test with that instruction and is never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from gpuweave.simulate.cluster_objects import inventory_object, profile_inventory

REPO = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO / "tests" / "e2e" / "harness"
NAMESPACE = "gpuweave-system"
ALLOCATED_CONDITION = "e2e.gpuweave.io/DevicesAllocated"
SA_AUDIENCE = "https://kubernetes.default.svc"
T = TypeVar("T")


def built_binary(default: Path, *, env: str, what: str, build: str) -> Path:
    """A Go binary the tests need (``$env`` overrides ``default``), or a test failure that says how
    to build it (never a skip)."""
    path = Path(os.environ.get(env, default))
    if not path.is_file():
        pytest.fail(f"{what} {path} is missing: build it with {build} or set {env}", pytrace=False)
    return path


def harness_binary() -> Path:
    """The built e2e harness (tests/e2e/harness) at the newest supported Kubernetes minor."""
    return built_binary(
        HARNESS_DIR / "bin" / "harness",
        env="GPUWEAVE_E2E_HARNESS",
        what="e2e harness binary",
        build="tests/e2e/harness/build.sh (Go >= 1.26, modules from the Go proxy; ~15 min cold)",
    )


def harness_k134_binary() -> Path:
    """The same harness built at the oldest supported minor, Kubernetes 1.34 (go.k134.mod, build
    tag k134), for the version-skew tests."""
    return built_binary(
        HARNESS_DIR / "bin" / "harness-k134",
        env="GPUWEAVE_E2E_HARNESS_K134",
        what="e2e harness binary at Kubernetes 1.34",
        build="tests/e2e/harness/build.sh (builds bin/harness and bin/harness-k134)",
    )


def wait_for(
    what: str,
    check: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    every: float = 0.2,
    seen: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something other than None/False; fail naming ``what``, and
    what ``seen`` says was there instead."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            instead = f"; instead: {seen()}" if seen is not None else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{instead}", pytrace=False)
        time.sleep(every)


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

    def __init__(self, work: Path, *, extra_args: Sequence[str] = (), harness: Path | None = None) -> None:
        """Start it in ``work``/control-plane; ``extra_args`` go to ``harness control-plane``
        (e.g. ``--apiserver-arg=--watch-cache=false``). ``harness`` is the harness binary of the
        whole cluster (every node, kube-scheduler and controller started on this plane runs it):
        by default the newest minor's, ``harness_k134_binary()`` for a 1.34 cluster."""
        self.dir = work / "control-plane"
        self.dir.mkdir(parents=True)
        self.work = work
        self.harness = harness or harness_binary()
        argv = [str(self.harness), "control-plane", "--dir", str(self.dir), *extra_args]
        self.process = Process("control-plane", argv, log_dir=work)
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
            [str(self.harness), "kustomize", str(directory)], check=True, capture_output=True, text=True
        ).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def apply(self, docs: list[dict[str, Any]], *, api: client.ApiClient | None = None) -> None:
        """Server-side apply each object, CRDs first (waiting until they are established)."""
        dyn = dynamic.DynamicClient(api or self.api)  # type: ignore[no-untyped-call]
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        for doc in crds + [d for d in docs if d["kind"] != "CustomResourceDefinition"]:
            self.apply_one(dyn, doc)
            if doc["kind"] == "CustomResourceDefinition":
                self._wait_established(dyn, doc["metadata"]["name"])

    @staticmethod
    def apply_one(
        dyn: dynamic.DynamicClient,
        doc: dict[str, Any],
        *,
        manager: str = "gpuweave-e2e",
        dry_run: bool = False,
    ) -> None:
        """Server-side apply one object; ``dry_run``: validated and defaulted, nothing stored."""
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        meta = doc["metadata"]
        resource.server_side_apply(
            body=doc,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=manager,
            force_conflicts=True,
            **({"dry_run": "All"} if dry_run else {}),
        )

    @staticmethod
    def _wait_established(dyn: dynamic.DynamicClient, name: str) -> None:
        crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")

        def established() -> bool:
            conditions = (crds.get(name=name).to_dict().get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(f"CRD {name} established", established, timeout=30)
        dyn.resources.invalidate_cache()

    def forget_node(self, name: str) -> None:
        """Delete a node's Node, ResourceSlices and GpuNodeInventory, as when it leaves the cluster
        (no garbage collector runs here), so later tests do not see it; absent objects are fine."""
        resource = client.ResourceV1Api(self.api)
        resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={name}")
        custom = client.CustomObjectsApi(self.api)
        for delete in (
            partial(custom.delete_cluster_custom_object, "gpuweave.io", "v1alpha1", "gpunodeinventories"),
            self.core.delete_node,
        ):
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def forget_extended_resource_classes(self) -> None:
        """Delete the DeviceClasses that name an extended resource (``manifests/dra`` has them), as
        a cluster that leaves DRA mode would: while one exists, kube-scheduler serves pods asking
        for that resource through DRA on every node that does not list it, so later device-plugin
        tests would see their pods wait."""
        resource = client.ResourceV1Api(self.api)
        for device_class in resource.list_device_class().items:
            name = device_class.metadata.name if device_class.metadata else None
            if name and getattr(device_class.spec, "extended_resource_name", None):
                with contextlib.suppress(ApiException):
                    resource.delete_device_class(name)

    def ensure_namespace(self, name: str) -> None:
        """A namespace with its default ServiceAccount (no controller-manager creates it here)."""
        with contextlib.suppress(ApiException):
            self.core.create_namespace({"metadata": {"name": name}})
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})

    def service_account_kubeconfig(
        self, name: str, *, namespace: str = NAMESPACE, bound_pod: Any | None = None
    ) -> Path:
        """A kubeconfig holding a TokenRequest token for the ServiceAccount (signed by the API
        server); with ``bound_pod`` the token is bound to that pod, as a kubelet's projected token
        is (the API server then adds the pod's node to the token's claims)."""
        spec: dict[str, Any] = {"audiences": [SA_AUDIENCE], "expirationSeconds": 3600}
        suffix = ""
        if bound_pod is not None:
            meta = bound_pod.metadata
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid}
            suffix = f"-{meta.name}"
        answer = self.core.create_namespaced_service_account_token(name, namespace, {"spec": spec})
        token = answer.status.token
        path = self.dir / f"sa-{namespace}-{name}{suffix}.kubeconfig"
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

    def node_agent_kubeconfig(self, node: str) -> Path:
        """The node agent's credentials as its DaemonSet pod on ``node`` gets them: a token of
        gpuweave-node-agent bound to a pod bound to that node, so the token names the node and
        manifests/admission-node-agent.yaml holds the agent to it. The pod stands in for the
        agent's own (it runs nothing: the agent runs as a process of the test)."""
        pod = {
            "metadata": {"name": f"gpuweave-node-agent-{node}", "labels": {"app": "gpuweave-node-agent"}},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "gpuweave-node-agent",
                "containers": [{"name": "node-agent", "image": "gpuweave:e2e"}],
            },
        }
        created = self.core.create_namespaced_pod(NAMESPACE, pod)
        return self.service_account_kubeconfig("gpuweave-node-agent", bound_pod=created)

    def allocation_of(self, namespace: str, name: str) -> dict[str, Any] | None:
        """What the kubelet's device manager allocated to the pod (harness pod condition), if admitted."""
        pod = self.core.read_namespaced_pod(name, namespace)
        for condition in pod.status.conditions or []:
            if condition.type == ALLOCATED_CONDITION:
                return dict(json.loads(condition.message))
        return None


def create_gpu_node(api: client.ApiClient, name: str, profile: str) -> None:
    """A Node and its GpuNodeInventory (spec and status) for a built-in profile, as a node agent
    would publish them, without a kubelet or agent."""
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    body = inventory_object(profile_inventory(profile, name))
    status = body.pop("status")
    created = custom.create_cluster_custom_object("gpuweave.io", "v1alpha1", "gpunodeinventories", body)
    created["status"] = status
    custom.replace_cluster_custom_object_status(
        "gpuweave.io", "v1alpha1", "gpunodeinventories", name, created
    )
