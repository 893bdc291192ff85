"""A loopback Kubernetes cluster for the e2e tests: the harness's real components plus ours.

``ControlPlane`` (tests/support/control_plane.py, shared with the transport tests) runs
``harness control-plane`` (embedded etcd + kube-apiserver) and applies manifests with the real
``kubernetes`` client. ``SimNode`` runs ``harness node`` (the kubelet's
device manager and admission) next to ``gpuweave node-agent --simulate`` on the same kubelet
directory. ``start_controllers`` runs the kube-controller-manager controllers DRA needs.
``start_scheduler`` runs the upstream kube-scheduler with the gpuweave-scheduler
profile from manifests/scheduler/, pointed at a ``gpuweave extender`` process.
``start_kueue`` and ``start_jobset`` run the Kueue and JobSet controller managers
(tests/e2e/queueing) after ``queueing_crds`` were applied.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.agent_node import run_sim_inject
from tests.support.control_plane import (
    ALLOCATED_CONDITION,
    HARNESS_DIR,
    NAMESPACE,
    REPO,
    SA_AUDIENCE,
    ControlPlane,
    Process,
    built_binary,
    harness_binary,
    harness_k134_binary,
    wait_for,
)

QUEUEING_DIR = REPO / "tests" / "e2e" / "queueing"
KUEUE_NAMESPACE = "kueue-system"

__all__ = [
    "ALLOCATED_CONDITION",
    "HARNESS_DIR",
    "NAMESPACE",
    "REPO",
    "SA_AUDIENCE",
    "ControlPlane",
    "Process",
    "SimNode",
    "free_port",
    "gpuweave_command",
    "harness_binary",
    "harness_k134_binary",
    "queueing_crds",
    "render_scheduler_config",
    "start_controllers",
    "start_extender",
    "start_jobset",
    "start_kueue",
    "start_scheduler",
    "stopping",
    "wait_for",
]


def gpuweave_command() -> list[str]:
    """Our CLI from the same virtualenv as the tests."""
    return [sys.executable, "-m", "gpuweave"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SimNode:
    """A Node: ``harness node`` (kubelet device manager, DRA manager and plugin watcher) +
    ``gpuweave node-agent --simulate`` (``agent_args`` added, e.g. ``--dra``)."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        name: str,
        profile: str,
        agent_kubeconfig: Path | None,
        health_config: Path | None = None,
        topology_policy: str = "none",
        agent_args: tuple[str, ...] = (),
        node_args: tuple[str, ...] = (),
        base: Path | None = None,
        log_level: str = "WARNING",
    ) -> None:
        """``node_args`` go to ``harness node`` (e.g. ``--cpu 192``); ``base`` is the node's
        directory (default ``nodes/<name>`` under the plane's work directory; long node names
        need a shorter one, since unix socket paths are limited)."""
        self.name = name
        self.topology_policy = topology_policy
        self.node_args = node_args
        self.plane = plane
        base = base or plane.work / "nodes" / name
        self.kubelet_dir = base / "kubelet"
        self.plugin_dir = self.kubelet_dir / "device-plugins"
        self.state_dir = base / "state"
        self.state_dir.mkdir(parents=True)
        self.kubelet_starts = 0
        self.agent_starts = 1
        self.kubelet = self._start_kubelet()
        wait_for(f"{name}'s device manager socket", self._kubelet_socket_ready, timeout=60)
        kube = ["--kubeconfig", str(agent_kubeconfig)] if agent_kubeconfig else ["--no-kube"]
        if health_config is not None:
            kube += ["--health-config", str(health_config)]
        self.agent = Process(
            f"node-agent-{name}",
            [
                *gpuweave_command(),
                *(("--log-level", log_level) if log_level != "WARNING" else ()),
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
                *agent_args,
            ],
            log_dir=plane.work,
        )

    def _start_kubelet(self) -> Process:
        self.kubelet_starts += 1
        argv = [str(self.plane.harness), "node", "--name", self.name]
        argv += ["--kubelet-dir", str(self.kubelet_dir), "--control-plane-dir", str(self.plane.dir)]
        argv += ["--topology-policy", self.topology_policy, *self.node_args]
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

    def restart_agent(self) -> None:
        """Stop the node agent and start it again with the same command line and state (its log:
        ``node-agent-<node>-<n>.log`` for the n-th restart)."""
        argv = [str(a) for a in self.agent.popen.args]  # type: ignore[union-attr]
        self.agent.stop()
        self.agent_starts += 1
        self.agent = Process(f"node-agent-{self.name}-{self.agent_starts}", argv, log_dir=self.plane.work)

    def inject(self, *args: str) -> None:
        run_sim_inject(self.state_dir, *args).check_returncode()

    def stop(self) -> None:
        self.agent.stop()
        self.kubelet.stop()


def render_scheduler_config(
    plane: ControlPlane,
    *,
    extender_url: str | None,
    kubeconfig: Path,
    scheduler_name: str | None = None,
    claims: bool = False,
) -> Path:
    """manifests/scheduler/scheduler-config.yaml, adapted to this cluster.

    Only what differs between a pod and this loopback run changes: the client kubeconfig, no
    leader election, the extender's URL (or no extender, for the baseline); ``scheduler_name``
    renames the profile, for a second scheduler beside the session's (its own file); ``claims``
    appends the entry of manifests/scheduler/claims-extender.yaml, as the chart's
    scheduler.extender.claims.enabled does.
    """
    source = yaml.safe_load((REPO / "manifests" / "scheduler" / "scheduler-config.yaml").read_text())
    if claims and extender_url is not None:
        entry = REPO / "manifests" / "scheduler" / "claims-extender.yaml"
        source["extenders"] += yaml.safe_load(entry.read_text())
    source["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400}
    source["leaderElection"] = {"leaderElect": False}
    if extender_url is None:
        source.pop("extenders", None)
    else:
        for extender in source.get("extenders", []):
            extender["urlPrefix"] = extender_url
    path = plane.dir / ("scheduler-config.yaml" if extender_url else "scheduler-config-no-extender.yaml")
    if scheduler_name is not None:
        for profile in source.get("profiles", []):
            profile["schedulerName"] = scheduler_name
        path = plane.dir / f"scheduler-config-{scheduler_name}.yaml"
    path.write_text(yaml.safe_dump(source))
    return path


def start_scheduler(
    plane: ControlPlane, *, config_path: Path, name: str = "kube-scheduler", metrics_port: int | None = None
) -> Process:
    """kube-scheduler from the harness; with ``metrics_port`` it serves /metrics on that loopback
    port over HTTPS (self-signed) to anyone, as a benchmark reads it; otherwise it serves nothing."""
    serving = ["--secure-port=0"]
    if metrics_port is not None:
        serving = [
            f"--secure-port={metrics_port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={plane.work / (name + '-certs')}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        ]
    return Process(
        name,
        [
            str(plane.harness),
            "kube-scheduler",
            f"--config={config_path}",
            *serving,
            f"--v={os.environ.get('GPUWEAVE_E2E_SCHEDULER_V', '2')}",
        ],
        log_dir=plane.work,
    )


def start_controllers(plane: ControlPlane, *, daemonsets: bool = False, jobs: bool = False) -> Process:
    """``harness controllers``: the ResourceClaim and device taint eviction controllers; with
    ``daemonsets`` also the DaemonSet controller and the root CA publisher, with ``jobs`` the Job
    controller."""
    argv = [str(plane.harness), "controllers", "--control-plane-dir", str(plane.dir)]
    argv += ["--daemonsets"] if daemonsets else []
    argv += ["--jobs"] if jobs else []
    name = "controllers" + ("-daemonsets" if daemonsets else "") + ("-jobs" if jobs else "")
    return Process(name, argv, log_dir=plane.work)


def delete_jobs_and_pods(plane: ControlPlane, namespace: str) -> None:
    """Delete a namespace's Jobs and then its pods by name (no garbage collector runs here) and wait
    until no pod is left."""
    from kubernetes import client  # noqa: PLC0415 (only the Job tests need the batch API)
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    batch = client.BatchV1Api(plane.api)
    for job in batch.list_namespaced_job(namespace).items:
        if job.metadata and job.metadata.name:
            batch.delete_namespaced_job(job.metadata.name, namespace, propagation_policy="Background")
    for pod in plane.core.list_namespaced_pod(namespace).items:
        try:
            plane.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(f"{namespace}'s pods to be deleted", lambda: not plane.core.list_namespaced_pod(namespace).items)


def _queueing_binary(name: str) -> Path:
    return built_binary(
        QUEUEING_DIR / "bin" / name,
        env=f"GPUWEAVE_E2E_{name.upper()}",
        what=f"{name} controller manager",
        build="tests/e2e/queueing/build.sh (run by tests/e2e/harness/build.sh)",
    )


def queueing_crds() -> list[dict[str, Any]]:
    """Kueue's and JobSet's CRDs, read from their Go modules in the module cache (the directories
    tests/e2e/queueing/build.sh recorded in bin/modules.json): Kueue's
    ``config/components/crd/bases`` as its kustomization lists them, without the conversion-webhook
    patches (nothing here serves conversion; every object is written and read at one version), and
    JobSet's ``jobset.x-k8s.io_jobsets.yaml``."""
    record = QUEUEING_DIR / "bin" / "modules.json"
    if not record.is_file():
        pytest.fail(f"{record} is missing: run tests/e2e/queueing/build.sh", pytrace=False)
    modules = json.loads(record.read_text())
    for module, directory in modules.items():
        if not Path(directory).is_dir():
            pytest.fail(
                f"{module} is no longer at {directory} (Go's module cache changed): "
                "run tests/e2e/queueing/build.sh again",
                pytrace=False,
            )
    kueue_crds = Path(modules["sigs.k8s.io/kueue"]) / "config" / "components" / "crd"
    listed = yaml.safe_load((kueue_crds / "kustomization.yaml").read_text())["resources"]
    paths = [kueue_crds / name for name in listed]
    paths.append(
        Path(modules["sigs.k8s.io/jobset"]) / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    )
    docs = []
    for path in paths:
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def _serving_cert_dir(plane: ControlPlane, name: str) -> Path:
    """tls.crt/tls.key for a manager's webhook (and Kueue's metrics) server: the API server's own
    serving pair (127.0.0.1, signed by the cluster CA). No webhook is registered with the API
    server, so nothing calls them; the managers only refuse to start without a pair."""
    certs = plane.work / f"{name}-certs"
    certs.mkdir(exist_ok=True)
    shutil.copyfile(plane.dir / "pki" / "apiserver.crt", certs / "tls.crt")
    shutil.copyfile(plane.dir / "pki" / "apiserver.key", certs / "tls.key")
    return certs


def _start_manager(
    plane: ControlPlane, *, name: str, argv: list[str], probe: str, timeout: float = 90
) -> Process:
    process = Process(name, argv, log_dir=plane.work, env={"KUBECONFIG": str(plane.admin_kubeconfig)})
    wait_for(
        f"{name} /readyz",
        lambda: process.alive_and(lambda: _http_ok(f"http://{probe}/readyz")),
        timeout=timeout,
    )
    return process


def start_kueue(plane: ControlPlane, *, name: str = "kueue") -> Process:
    """The Kueue controller manager (``sigs.k8s.io/kueue/cmd/kueue``) with the admin kubeconfig.

    Its configuration turns off what needs an in-cluster Deployment: internal cert management
    (no Secret, no webhook configurations, no CA injection into CRDs), leader election, the
    metrics listener and the visibility API server (VisibilityOnDemand: an aggregated API). Its
    webhook server listens on a loopback port with the API server's serving pair, but no webhook
    is registered, so objects must arrive as Kueue's webhooks would have left them (a JobSet
    already ``suspend: true``). With internal cert management off Kueue reads its metrics
    certificate from the fixed path /etc/kueue/metrics/certs even when metrics are off, so the
    manager runs in its own mount namespace (``unshare``) with /etc an overlay (host /etc below, a
    tmpfs above) holding that directory: the host's /etc is untouched. Integrations: batch/v1 Job
    and JobSet. Returns once /readyz answers.
    """
    plane.ensure_namespace(KUEUE_NAMESPACE)
    certs = _serving_cert_dir(plane, name)
    probe = f"127.0.0.1:{free_port()}"
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": probe},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    path = plane.dir / f"{name}-config.yaml"
    path.write_text(yaml.safe_dump(config))
    overlay = plane.work / f"{name}-etc"
    overlay.mkdir(exist_ok=True)
    script = (
        'set -e; mount -t tmpfs tmpfs "$1"; mkdir "$1/upper" "$1/work"; '
        'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc; '
        "mkdir -p /etc/kueue/metrics/certs; "
        'cp "$2/tls.crt" "$2/tls.key" /etc/kueue/metrics/certs/; shift 2; exec "$@"'
    )
    binary = str(_queueing_binary("kueue"))
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]
    argv += [str(overlay), str(certs), binary, f"--config={path}", "--zap-log-level=2"]
    return _start_manager(plane, name=name, argv=argv, probe=probe)


def start_jobset(plane: ControlPlane, *, name: str = "jobset") -> Process:
    """The JobSet controller manager (``sigs.k8s.io/jobset``) with the admin kubeconfig: internal
    cert management, leader election and metrics off; its webhook server on a loopback port with
    the API server's serving pair and no webhook registered (a JobSet must be created with the
    fields JobSet's defaulting webhook would set). Returns once /readyz answers."""
    certs = _serving_cert_dir(plane, name)
    probe = f"127.0.0.1:{free_port()}"
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": probe},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
    }
    path = plane.dir / f"{name}-config.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [str(_queueing_binary("jobset")), f"--config={path}"]
    return _start_manager(plane, name=name, argv=argv, probe=probe)


def start_extender(
    plane: ControlPlane,
    *,
    kubeconfig: Path,
    port: int | None = None,
    extra_args: tuple[str, ...] = (),
    name: str = "extender",
) -> tuple[Process, str]:
    """``gpuweave extender`` on a loopback port (a free one unless given; a restart reuses its
    port, as kube-scheduler's configuration names it); returns it once /readyz answers.

    Each extender leads a Lease of its own in the gpuweave namespace (its service account may
    write Leases there; named after the port, so a restart takes its own Lease back at once),
    unless ``extra_args`` name one: extenders of different tests never wait for each other."""
    port = port or free_port()
    listen = ["--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig)]
    if not any(arg.startswith("--leader-elect") for arg in extra_args):
        listen += [
            "--leader-elect-namespace",
            NAMESPACE,
            "--leader-elect-name",
            f"gpuweave-e2e-extender-{port}",
        ]
    process = Process(name, [*gpuweave_command(), "extender", *listen, *extra_args], log_dir=plane.work)
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
