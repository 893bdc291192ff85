"""End-to-end scheduling throughput: GPU pods/s bound by the real kube-scheduler at 1,000 Nodes.

One run of the e2e harness's real control plane (kube-apiserver on embedded etcd, built from
k8s.io/kubernetes; see docs/e2e.md) holds N Node objects with 8 GPUs each and their
GpuNodeInventory objects (as the node agent publishes them, every device UUID unique). Two phases
schedule the same batch of GPU pods (a mix of 1/2/4/8 GPUs):

- ``baseline``: kube-scheduler with the gpuweave-scheduler profile but no extender;
- ``extender``: the same kube-scheduler with the profile from manifests/scheduler/, calling
  ``gpuweave extender`` (filter, prioritize, bind with the assignment annotation) over HTTP.

Pods are created before the phase's scheduler starts, so the rate measures scheduling and
binding, not pod creation: pods/s = (bound - 1) / (last bind - first bind), binds observed by a
watch. Between phases the pods are deleted and the Nodes are empty again. Target: >= 100 pods/s
with the extender. Writes ``benchmarks/results/e2e_throughput.json`` and prints a table.

    tests/e2e/harness/build.sh   # once
    .venv/bin/python -m benchmarks.e2e_throughput [--nodes 1000] [--pods 1000]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from deviceplugin.published import inventory_object
from scheduler_ext.samples import profile_inventory
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    Process,
    render_scheduler_config,
    start_extender,
    start_scheduler,
)

RESULTS = Path(__file__).parent / "results" / "e2e_throughput.json"
PROFILES = ("dgx-h100", "dgx1-v100", "l40s-pcie-8", "dgx-a100")
GPU_MIX = (1, 1, 2, 2, 4, 8)
NAMESPACE = "bench"
SCHEDULER_NAME = "gpuweave-scheduler"
WORKERS = 16


@dataclass(frozen=True)
class PhaseResult:
    phase: str
    pods: int
    bound: int
    seconds: float
    pods_per_s: float


def _parallel(calls: Iterable[Callable[[], object]]) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()


def _node_calls(core: Any, custom: Any, name: str, profile: str) -> Callable[[], None]:
    def create() -> None:
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "gpuweave.io/gpu-node": "true"}
        core.create_node({"metadata": {"name": name, "labels": labels}})
        resources = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "benchmark node"}
        status = {"capacity": resources, "allocatable": resources, "conditions": [ready]}
        core.patch_node_status(name, {"status": status})
        body = inventory_object(profile_inventory(profile, name))
        args = ("gpuweave.io", "v1alpha1", "gpunodeinventories")
        custom.create_cluster_custom_object(*args, {k: v for k, v in body.items() if k != "status"})
        custom.patch_cluster_custom_object_status(*args, name, {"status": body["status"]})

    return create


def make_nodes(plane: ControlPlane, count: int) -> None:
    core, custom = plane.core, client.CustomObjectsApi(plane.api)
    names = [(f"bench-{i:05d}", PROFILES[i % len(PROFILES)]) for i in range(count)]
    _parallel(_node_calls(core, custom, name, profile) for name, profile in names)


def _pod(index: int) -> dict[str, Any]:
    gpus = GPU_MIX[index % len(GPU_MIX)]
    limits = {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"}
    container = {"name": "main", "image": "bench/none", "resources": {"limits": limits, "requests": limits}}
    spec = {"schedulerName": SCHEDULER_NAME, "containers": [container], "terminationGracePeriodSeconds": 0}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"gpu-{index:05d}"}, "spec": spec}


def create_pods(plane: ControlPlane, count: int) -> None:
    core = plane.core

    def creator(index: int) -> Callable[[], object]:
        return lambda: core.create_namespaced_pod(NAMESPACE, _pod(index))

    _parallel(creator(i) for i in range(count))


def delete_pods(plane: ControlPlane) -> None:
    plane.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    deadline = time.monotonic() + 300
    while plane.core.list_namespaced_pod(NAMESPACE, limit=1).items and time.monotonic() < deadline:
        time.sleep(0.5)


def watch_binds(plane: ControlPlane, count: int, *, quiet_s: float = 10.0) -> tuple[int, float]:
    """Count pods getting spec.nodeName until all are bound or none was for ``quiet_s``.

    Returns (bound, seconds from the first to the last bind). Pods no node can take (the
    baseline fragments nodes, so some 8-GPU pods stay pending) end the phase by quiescence.
    """
    bound: set[str] = set()
    first = last = 0.0
    version = plane.core.list_namespaced_pod(NAMESPACE, limit=1).metadata.resource_version
    progress = time.monotonic()
    while len(bound) < count and time.monotonic() - progress < quiet_s:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(  # type: ignore[no-untyped-call]
            plane.core.list_namespaced_pod, NAMESPACE, resource_version=version, timeout_seconds=2
        ):
            pod = event["object"]
            version = pod.metadata.resource_version
            if pod.spec.node_name and pod.metadata.name not in bound:
                last = progress = time.monotonic()
                first = first or last
                bound.add(pod.metadata.name)
    return len(bound), last - first


def run_phase(plane: ControlPlane, *, phase: str, pods: int, config_path: Path) -> PhaseResult:
    create_pods(plane, pods)
    scheduler = start_scheduler(plane, config_path=config_path, name=f"kube-scheduler-{phase}")
    try:
        bound, seconds = watch_binds(plane, pods)
    finally:
        scheduler.stop()
    delete_pods(plane)
    rate = (bound - 1) / seconds if seconds > 0 else 0.0
    return PhaseResult(
        phase=phase, pods=pods, bound=bound, seconds=round(seconds, 2), pods_per_s=round(rate, 1)
    )


def extender_verb_means(url: str) -> dict[str, float]:
    """Mean milliseconds per extender verb over the phase, from the extender's own /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            prefix = f'gpuweave_extender_request_seconds{suffix}{{verb="'
            if line.startswith(prefix):
                verb = line[len(prefix) :].split('"', 1)[0]
                into[verb] = float(line.rsplit(" ", 1)[1])
    return {verb: round(1000 * sums[verb] / counts[verb], 2) for verb in sums if counts.get(verb)}


def run(nodes: int, pods: int, work: Path) -> tuple[list[PhaseResult], dict[str, float]]:
    plane = ControlPlane(work)
    extender: Process | None = None
    try:
        plane.apply(plane.kustomize(REPO / "manifests"))
        plane.ensure_namespace(NAMESPACE)
        started = time.monotonic()
        make_nodes(plane, nodes)
        print(f"{nodes} Nodes and GpuNodeInventories created in {time.monotonic() - started:.0f} s")
        kubeconfig = plane.service_account_kubeconfig("gpuweave-scheduler")
        baseline = render_scheduler_config(plane, extender_url=None, kubeconfig=kubeconfig)
        results = [run_phase(plane, phase="baseline", pods=pods, config_path=baseline)]
        extender, url = start_extender(plane, kubeconfig=kubeconfig)
        with_extender = render_scheduler_config(plane, extender_url=url, kubeconfig=kubeconfig)
        results.append(run_phase(plane, phase="extender", pods=pods, config_path=with_extender))
        return results, extender_verb_means(url)
    finally:
        if extender is not None:
            extender.stop()
        plane.stop()


def report(results: list[PhaseResult], verb_ms: dict[str, float], *, nodes: int) -> None:
    baseline, ours = results[0], results[-1]
    ratio = ours.pods_per_s / baseline.pods_per_s if baseline.pods_per_s else 0.0
    print(
        f"\nend-to-end scheduling throughput, {nodes} Nodes x 8 GPUs (real kube-scheduler + kube-apiserver)"
    )
    print(f"{'phase':<10} {'pods':>6} {'bound':>6} {'seconds':>8} {'pods/s':>8}")
    for r in results:
        print(f"{r.phase:<10} {r.pods:>6} {r.bound:>6} {r.seconds:>8.2f} {r.pods_per_s:>8.1f}")
    verdict = "meets" if ours.pods_per_s >= 100 else "misses"
    print(f"extender/baseline = {ratio:.2f}; {verdict} the 100 pods/s target")
    print(
        "extender mean ms per call: " + ", ".join(f"{verb} {ms:.1f}" for verb, ms in sorted(verb_ms.items()))
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "e2e_throughput",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "processor": platform.processor()},
        "nodes": nodes,
        "results": [asdict(r) for r in results],
        "extender_over_baseline": round(ratio, 3),
        "extender_mean_ms_per_verb": verb_ms,
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuweave-e2e-bench-") as work:
        results, verb_ms = run(args.nodes, args.pods, Path(work))
    report(results, verb_ms, nodes=args.nodes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
