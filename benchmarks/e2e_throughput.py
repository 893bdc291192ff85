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
watch. Between phases the pods are deleted and the Nodes are empty again. Target: with the
extender >= 0.8x the pods/s of kube-scheduler alone in the same run.

Cost per scheduled pod: for each phase, the CPU seconds (user + system, from /proc) each process
spent from the phase's start to its last bind, divided by the pods bound: kube-scheduler, the
control plane (kube-apiserver + etcd, one process) and, in the extender phase, the extender,
whose resident memory (now and peak) is read at the end of the phase; and, from kube-apiserver's
/metrics, the requests it served, the heap it allocated per pod and its GC cycles in the phase.
``--profile FILE`` records the first extender phase's scheduling with py-spy (speedscope JSON;
collapsed stacks for a ``.txt`` file) when py-spy is installed: from kube-scheduler's start to the
last bind, the window the CPU figures cover (not the pods' creation or deletion), at
``PROFILE_RATE_HZ``.

Writes ``benchmarks/results/e2e_throughput.json`` (``e2e_throughput_<nodes>.json`` for another
node count) and prints a table.

    tests/e2e/harness/build.sh   # once
    .venv/bin/python -m benchmarks.e2e_throughput [--nodes 1000] [--pods 1000] [--profile FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.results_file import RESULTS_DIR, write_results
from gpuweave.simulate.cluster_objects import profile_inventory
from kubeio.listwatch import ListWatch
from nodeagent.published import inventory_object
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    Process,
    free_port,
    render_scheduler_config,
    start_extender,
    start_scheduler,
)

PROFILES = ("dgx-h100", "dgx1-v100", "l40s-pcie-8", "dgx-a100")
GPU_MIX = (1, 1, 2, 2, 4, 8)
NAMESPACE = "bench"
SCHEDULER_NAME = "gpuweave-scheduler"
WORKERS = 16
ROUNDS = 3  # baseline/extender pairs: the machine's speed drifted by up to 20% within one run
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROFILE_RATE_HZ = 250  # py-spy samples per second: a 10 s phase gives a few thousand stacks


@dataclass(frozen=True)
class PhaseResult:
    phase: str
    pods: int
    bound: int
    seconds: float
    pods_per_s: float
    cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)  # process -> CPU ms per bound pod
    system_cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)  # of which in the kernel
    extender_rss_mib: float | None = None
    extender_peak_rss_mib: float | None = None
    # kube-apiserver requests served in the phase per bound pod, "VERB resource[/subresource]"
    # (apiserver_request_total; every client together, the benchmark's own pod creation included)
    api_requests_per_pod: dict[str, float] = field(default_factory=dict)
    round: int = 0  # phases alternate: baseline 0, extender 0, baseline 1, extender 1, ...
    # the control plane's Go heap allocations per bound pod and its GC cycles in the phase
    # (go_memstats_alloc_bytes_total, go_gc_duration_seconds_count): whether a phase's extra CPU
    # is garbage (say, from the extender's first lists just before) or work per request
    control_plane_alloc_kib_per_pod: float | None = None
    control_plane_gc_cycles: int | None = None
    # kube-scheduler's own scheduling_algorithm_duration histogram over the phase (the scheduling
    # cycle's filter and score, extender calls included; binding is not in it): p50 and p99 in ms
    scheduler_algorithm_ms: dict[str, float] = field(default_factory=dict)
    # the extender's own time per call (read to written) for filter, prioritize and bind: p50, p99 in ms
    extender_verb_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    # seconds from the extender's start to its first sync (every list in, /readyz 200); extender
    # phases only, not part of the phase's rate
    extender_first_sync_s: float | None = None


@dataclass(frozen=True)
class ApiServerCounters:
    """kube-apiserver's /metrics counters the benchmark reads at a phase's start and end."""

    requests: Counter[str]  # apiserver_request_total, summed per verb and resource
    allocated_bytes: float  # go_memstats_alloc_bytes_total
    gc_cycles: float  # go_gc_duration_seconds_count

    def __sub__(self, other: ApiServerCounters) -> ApiServerCounters:
        return ApiServerCounters(
            self.requests - other.requests,
            self.allocated_bytes - other.allocated_bytes,
            self.gc_cycles - other.gc_cycles,
        )


def api_counters(plane: ControlPlane) -> ApiServerCounters:
    """kube-apiserver's request, allocation and GC counters so far."""
    method, url, headers, body, _ = plane.api.param_serialize(
        "GET", "/metrics", auth_settings=["BearerToken"]
    )
    response = plane.api.call_api(method, url, header_params=headers, body=body)
    response.read()
    return parse_api_counters(response.data.decode())


def parse_api_counters(text: str) -> ApiServerCounters:
    counts: Counter[str] = Counter()
    go: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("go_memstats_alloc_bytes_total", "go_gc_duration_seconds_count"):
            go[name] = float(value)
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split(",") if "=" in part)
        label = {k: v.strip('"') for k, v in labels.items()}
        resource = label.get("resource", "")
        if label.get("subresource"):
            resource += "/" + label["subresource"]
        counts[f"{label.get('verb', '?')} {resource or label.get('component', '?')}"] += int(float(value))
    return ApiServerCounters(
        counts, go.get("go_memstats_alloc_bytes_total", 0.0), go.get("go_gc_duration_seconds_count", 0.0)
    )


ALGORITHM_HISTOGRAM = "scheduler_scheduling_algorithm_duration_seconds"


def histogram_buckets(text: str, name: str, *, label: str = "") -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of one Prometheus histogram, summed over its label
    sets other than ``le`` (only those with ``label``, ``verb="filter"`` say, when given), in
    bound order."""
    counts: dict[float, float] = {}
    prefix = f"{name}_bucket{{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].rpartition("} ")
        if label and label not in labels.split(","):
            continue
        bound = next(part.split("=", 1)[1].strip('"') for part in labels.split(",") if part.startswith("le="))
        le = float("inf") if bound == "+Inf" else float(bound)
        counts[le] = counts.get(le, 0.0) + float(value)
    return sorted(counts.items())


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in; None if empty."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def scheduler_algorithm_ms(port: int) -> dict[str, float]:
    """p50/p99 of kube-scheduler's scheduling algorithm duration so far, from its /metrics."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate, on loopback
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10, context=context) as answer:
        return quantiles_ms(histogram_buckets(answer.read().decode(), ALGORITHM_HISTOGRAM))


def quantiles_ms(buckets: list[tuple[float, float]]) -> dict[str, float]:
    """p50 and p99 in milliseconds of a histogram in seconds (none when it is empty)."""
    out = {}
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        value = bucket_quantile(buckets, q)
        if value is not None:
            out[label] = round(1000 * value, 2)
    return out


EXTENDER_HISTOGRAM = "gpuweave_extender_request_seconds"
LATENCY_VERBS = ("filter", "prioritize", "bind")


def extender_verb_ms(text: str) -> dict[str, dict[str, float]]:
    """Per verb, p50/p99 of the extender's own request time (read to written, its histogram:
    buckets 0.5, 1, 2, 5, 10 ms ..., so the quantiles are interpolated within a bucket)."""
    return {
        verb: quantiles_ms(histogram_buckets(text, EXTENDER_HISTOGRAM, label=f'verb="{verb}"'))
        for verb in LATENCY_VERBS
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (/proc/PID/stat fields 14 and 15)."""
    return sum(cpu_times(pid))


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) in MiB, from /proc/PID/status."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return round(values["VmRSS"], 1), round(values["VmHWM"], 1)


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


class BindWatch:
    """Counts pods getting spec.nodeName, through the project's one list+watch (raw JSON, so the
    benchmark's own watch costs little of the CPU the measured processes share)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.bound: set[str] = set()
        self.first = self.last = 0.0
        self._lock = threading.Lock()
        list_call = client.CoreV1Api(plane.api).list_namespaced_pod
        self._watch = ListWatch(
            lambda **kw: list_call(NAMESPACE, **kw), on_event=self._on_event, what="benchmark pods"
        )

    def _on_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind != "DELETED" and (pod.get("spec") or {}).get("nodeName") and name not in self.bound:
            with self._lock:
                self.last = time.monotonic()
                self.first = self.first or self.last
                self.bound.add(name)

    def __enter__(self) -> BindWatch:
        self._watch.start()
        self._watch.synced.wait(60)
        return self

    def __exit__(self, *_: object) -> None:
        self._watch.stop()

    def wait(self, count: int, *, quiet_s: float = 10.0) -> tuple[int, float]:
        """Until all ``count`` are bound or none was for ``quiet_s``: (bound, first to last bind s).
        Pods no node can take (the baseline fragments nodes, so some 8-GPU pods stay pending) end
        the phase by quiescence."""
        progress = time.monotonic()
        seen = 0
        while len(self.bound) < count and time.monotonic() - progress < quiet_s:
            time.sleep(0.1)
            if len(self.bound) != seen:
                seen, progress = len(self.bound), time.monotonic()
        return len(self.bound), self.last - self.first


def run_phase(
    plane: ControlPlane,
    *,
    phase: str,
    round_: int = 0,
    pods: int,
    config_path: Path,
    extender: Process | None = None,
    profiler: Profiler | None = None,
) -> PhaseResult:
    create_pods(plane, pods)
    with BindWatch(plane) as binds:
        metrics_port = free_port()
        name = f"kube-scheduler-{phase}-{round_}"
        scheduler = start_scheduler(plane, config_path=config_path, name=name, metrics_port=metrics_port)
        processes = {"kube-scheduler": scheduler, "control-plane": plane.process}
        if extender is not None:
            processes["extender"] = extender
        if profiler is not None and extender is not None:
            profiler.start(extender.popen.pid)  # the scheduling only: not the pods' creation or deletion
        before = {name: cpu_times(p.popen.pid) for name, p in processes.items()}
        counters_before = api_counters(plane)
        try:
            try:
                bound, seconds = binds.wait(pods)
            finally:
                if profiler is not None:
                    profiler.stop()
            after = {name: cpu_times(p.popen.pid) for name, p in processes.items()}
            spent = {name: sum(after[name]) - sum(before[name]) for name in processes}
            system = {name: after[name][1] - before[name][1] for name in processes}
            counters = api_counters(plane) - counters_before
            memory = rss_mib(extender.popen.pid) if extender is not None else (None, None)
            algorithm = scheduler_algorithm_ms(metrics_port)
        finally:
            scheduler.stop()
    delete_pods(plane)
    rate = (bound - 1) / seconds if seconds > 0 else 0.0
    return PhaseResult(
        phase=phase,
        round=round_,
        pods=pods,
        bound=bound,
        seconds=round(seconds, 2),
        pods_per_s=round(rate, 1),
        cpu_ms_per_pod={name: round(1000 * cpu / max(bound, 1), 2) for name, cpu in spent.items()},
        system_cpu_ms_per_pod={name: round(1000 * cpu / max(bound, 1), 2) for name, cpu in system.items()},
        extender_rss_mib=memory[0],
        extender_peak_rss_mib=memory[1],
        api_requests_per_pod={
            key: round(count / max(bound, 1), 2) for key, count in sorted(counters.requests.items()) if count
        },
        control_plane_alloc_kib_per_pod=round(counters.allocated_bytes / 1024 / max(bound, 1), 1),
        control_plane_gc_cycles=int(counters.gc_cycles),
        scheduler_algorithm_ms=algorithm,
    )


class Profiler:
    """py-spy recording one process while a phase runs (speedscope JSON, or collapsed stacks for a
    ``.txt`` file); nothing without py-spy."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self._recorder: subprocess.Popen[bytes] | None = None

    def start(self, pid: int) -> None:
        if self.out is None:
            return
        beside = Path(sys.executable).parent / "py-spy"  # installed into this virtualenv
        spy = str(beside) if beside.exists() else shutil.which("py-spy")
        if spy is None:
            print("--profile: py-spy is not installed (pip install py-spy); not profiling")
            return
        form = "raw" if self.out.suffix == ".txt" else "speedscope"  # raw: collapsed stacks, one per line
        argv = [spy, "record", "--pid", str(pid), "--format", form, "--output", str(self.out)]
        # --gil: only the thread holding the GIL is sampled, so the profile shows where the CPU
        # goes, not threads blocked in a socket read (which py-spy would count as running)
        self._recorder = subprocess.Popen([*argv, "--rate", str(PROFILE_RATE_HZ), "--nonblocking", "--gil"])

    def stop(self) -> None:
        if self._recorder is not None:
            self._recorder.send_signal(2)  # SIGINT: py-spy writes its file and exits
            self._recorder.wait(60)
            self._recorder = None
            print(f"extender profile: {self.out}")


def extender_metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def extender_verbs(text: str) -> dict[str, dict[str, float]]:
    """Per extender verb over the phase, from the extender's own /metrics: mean milliseconds per
    call and calls (more calls than pods means kube-scheduler retried pods)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            prefix = f'gpuweave_extender_request_seconds{suffix}{{verb="'
            if line.startswith(prefix):
                verb = line[len(prefix) :].split('"', 1)[0]
                into[verb] = float(line.rsplit(" ", 1)[1])
    return {
        "mean_ms": {verb: round(1000 * sums[verb] / counts[verb], 2) for verb in sums if counts.get(verb)},
        "calls": {verb: int(count) for verb, count in counts.items()},
    }


def run(
    nodes: int, pods: int, work: Path, *, rounds: int = ROUNDS, profile: Path | None = None
) -> tuple[list[PhaseResult], dict[str, dict[str, float]]]:
    """``rounds`` times a baseline phase, then an extender phase with an extender started for it
    (its first sync is not part of the phase; no extender runs during a baseline phase)."""
    plane = ControlPlane(work)
    extender: Process | None = None
    profiler = Profiler(profile)
    verbs: list[dict[str, dict[str, float]]] = []
    try:
        plane.apply(plane.kustomize(REPO / "manifests"))
        plane.ensure_namespace(NAMESPACE)
        started = time.monotonic()
        make_nodes(plane, nodes)
        print(f"{nodes} Nodes and GpuNodeInventories created in {time.monotonic() - started:.0f} s")
        kubeconfig = plane.service_account_kubeconfig("gpuweave-scheduler")
        baseline = render_scheduler_config(plane, extender_url=None, kubeconfig=kubeconfig)
        results: list[PhaseResult] = []
        for round_ in range(rounds):
            results.append(run_phase(plane, phase="baseline", round_=round_, pods=pods, config_path=baseline))
            started = time.monotonic()
            extender, url = start_extender(plane, kubeconfig=kubeconfig, name=f"extender-{round_}")
            first_sync_s = round(time.monotonic() - started, 2)
            print(f"extender ready (first sync of {nodes} Nodes) in {first_sync_s:.1f} s")
            with_extender = render_scheduler_config(plane, extender_url=url, kubeconfig=kubeconfig)
            results.append(
                run_phase(
                    plane,
                    phase="extender",
                    round_=round_,
                    pods=pods,
                    config_path=with_extender,
                    extender=extender,
                    profiler=profiler if round_ == 0 else None,
                )
            )
            text = extender_metrics(url)
            verbs.append(extender_verbs(text))
            results[-1] = replace(
                results[-1], extender_verb_ms=extender_verb_ms(text), extender_first_sync_s=first_sync_s
            )
            extender.stop()
            extender = None
        return results, merged_verbs(verbs)
    finally:
        if extender is not None:
            extender.stop()
        plane.stop()


def merged_verbs(per_extender: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Calls per verb summed over the extender phases, mean milliseconds weighted by calls."""
    calls: Counter[str] = Counter()
    spent: dict[str, float] = {}
    for verbs in per_extender:
        for verb, count in verbs["calls"].items():
            calls[verb] += int(count)
            spent[verb] = spent.get(verb, 0.0) + count * verbs["mean_ms"].get(verb, 0.0)
    return {
        "mean_ms": {verb: round(spent[verb] / calls[verb], 2) for verb in calls if calls[verb]},
        "calls": {verb: float(count) for verb, count in calls.items()},
    }


def median_rate(results: list[PhaseResult], phase: str) -> float:
    return statistics.median(r.pods_per_s for r in results if r.phase == phase)


def results_path(nodes: int) -> Path:
    return RESULTS_DIR / ("e2e_throughput.json" if nodes == 1000 else f"e2e_throughput_{nodes}.json")


def cost_per_pod(results: list[PhaseResult]) -> dict[str, Any]:
    """The extender's cost per bound pod against kube-scheduler's, both in the extender phases
    (medians over rounds), and the extender's added latency per scheduling cycle as kube-scheduler
    measures it: its algorithm duration with the extender minus without (median p50 and p99)."""
    ours = [r for r in results if r.phase == "extender"]
    extender = statistics.median(r.cpu_ms_per_pod["extender"] for r in ours)
    scheduler = statistics.median(r.cpu_ms_per_pod["kube-scheduler"] for r in ours)
    cost: dict[str, Any] = {
        "extender_cpu_ms_per_pod": round(extender, 2),
        "scheduler_cpu_ms_per_pod": round(scheduler, 2),
        "extender_over_scheduler_cpu": round(extender / scheduler, 3) if scheduler else None,
    }
    added = {}
    for label in ("p50", "p99"):
        with_ext = [r.scheduler_algorithm_ms[label] for r in ours if label in r.scheduler_algorithm_ms]
        without = [
            r.scheduler_algorithm_ms[label]
            for r in results
            if r.phase == "baseline" and label in r.scheduler_algorithm_ms
        ]
        if with_ext and without:
            added[label] = round(statistics.median(with_ext) - statistics.median(without), 2)
    if added:
        cost["extender_added_cycle_ms"] = added
    latency: dict[str, dict[str, float]] = {}
    for verb in LATENCY_VERBS:
        for label in ("p50", "p99"):
            values = [
                r.extender_verb_ms[verb][label] for r in ours if label in r.extender_verb_ms.get(verb, {})
            ]
            if values:
                latency.setdefault(verb, {})[label] = round(statistics.median(values), 2)
    if latency:
        cost["extender_verb_ms"] = latency
    return cost


def phase_medians(results: list[PhaseResult]) -> dict[str, Any]:
    """Medians over the rounds, per phase: CPU ms per pod of each process (and all together),
    kube-apiserver requests per pod (``"POST pods/binding"`` as ``POST_pods/binding``), and the
    extender's RSS, peak RSS and first sync."""
    cpu: dict[str, dict[str, float]] = {}
    requests: dict[str, dict[str, float]] = {}
    for phase in ("baseline", "extender"):
        rows = [r for r in results if r.phase == phase]
        medians = {
            name: statistics.median(r.cpu_ms_per_pod[name] for r in rows) for name in rows[0].cpu_ms_per_pod
        }
        cpu[phase] = {name: round(ms, 2) for name, ms in medians.items()} | {
            "all": round(sum(medians.values()), 2)
        }
        keys = sorted({key for r in rows for key in r.api_requests_per_pod})
        requests[phase] = {
            key.replace(" ", "_"): round(
                statistics.median(r.api_requests_per_pod.get(key, 0.0) for r in rows), 2
            )
            for key in keys
        }
    ours = [r for r in results if r.phase == "extender"]

    def median_of(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(statistics.median(known), 2) if known else None

    return {
        "cpu_ms_per_pod_median": cpu,
        "api_requests_per_pod_median": requests,
        "extender_rss_mib_median": median_of([r.extender_rss_mib for r in ours]),
        "extender_peak_rss_mib_median": median_of([r.extender_peak_rss_mib for r in ours]),
        "extender_first_sync_s_median": median_of([r.extender_first_sync_s for r in ours]),
    }


def report(
    results: list[PhaseResult],
    verbs: dict[str, dict[str, float]],
    *,
    nodes: int,
    argv: list[str] | None = None,
) -> None:
    baseline_rate, extender_rate = median_rate(results, "baseline"), median_rate(results, "extender")
    ratio = extender_rate / baseline_rate if baseline_rate else 0.0
    per_round = [
        round(e.pods_per_s / b.pods_per_s, 3) if b.pods_per_s else 0.0
        for b, e in zip(results[0::2], results[1::2], strict=True)
    ]
    print(
        f"\nend-to-end scheduling throughput, {nodes} Nodes x 8 GPUs (real kube-scheduler + kube-apiserver)"
    )
    print(f"{'phase':<9} round  pods bound seconds  pods/s  CPU ms per bound pod (of which system)")
    for r in results:
        cpu = ", ".join(
            f"{name} {ms:.2f} ({r.system_cpu_ms_per_pod.get(name, 0.0):.2f})"
            for name, ms in r.cpu_ms_per_pod.items()
        )
        rate = f"{r.seconds:>7.2f} {r.pods_per_s:>7.1f}"
        print(f"{r.phase:<9} {r.round:>5} {r.pods:>5} {r.bound:>5} {rate}  {cpu}")
    verdict = "meets" if ratio >= 0.8 else "misses"
    print(
        f"extender/baseline = {ratio:.2f} (median pods/s {extender_rate:.1f} / {baseline_rate:.1f}; "
        f"per round {', '.join(f'{x:.2f}' for x in per_round)}); {verdict} the 0.8x target"
    )
    for phase in ("baseline", "extender"):
        cpu_rows = [r.cpu_ms_per_pod for r in results if r.phase == phase]
        medians = {name: statistics.median(row[name] for row in cpu_rows) for name in cpu_rows[0]}
        print(
            f"{phase} median CPU ms per pod: "
            + ", ".join(f"{k} {v:.2f}" for k, v in medians.items())
            + f" ({sum(medians.values()):.2f} in all)"
        )
    for r in results[:2]:
        top = sorted(r.api_requests_per_pod.items(), key=lambda kv: -kv[1])[:6]
        print(f"{r.phase} API requests per pod: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
    for phase in ("baseline", "extender"):
        rows = [r for r in results if r.phase == phase]
        print(
            f"{phase} control-plane heap allocated per pod (KiB) / GC cycles: "
            + ", ".join(f"{r.control_plane_alloc_kib_per_pod} / {r.control_plane_gc_cycles}" for r in rows)
        )
    cost = cost_per_pod(results)
    print(
        f"extender CPU per bound pod: {cost['extender_cpu_ms_per_pod']:.2f} ms against kube-scheduler's "
        f"{cost['scheduler_cpu_ms_per_pod']:.2f} ms in the same phases: "
        f"{cost['extender_over_scheduler_cpu']:.2f}x (medians; target <= 0.3x)"
    )
    for r in results:
        if r.scheduler_algorithm_ms:
            shown = ", ".join(f"{k} {v:.2f} ms" for k, v in r.scheduler_algorithm_ms.items())
            print(f"{r.phase} {r.round}: kube-scheduler's scheduling algorithm {shown}")
    added = cost.get("extender_added_cycle_ms")
    if added:
        print(
            "extender's added latency per scheduling cycle (kube-scheduler's algorithm duration, "
            "extender phase minus baseline, medians): "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in added.items())
        )
    ours = [r for r in results if r.phase == "extender"]
    print(
        "extender RSS "
        + ", ".join(f"{r.extender_rss_mib} MiB (peak {r.extender_peak_rss_mib} MiB)" for r in ours)
    )
    calls = (
        f"{verb} {int(verbs['calls'][verb])} ({ms:.1f})" for verb, ms in sorted(verbs["mean_ms"].items())
    )
    print("extender calls (mean ms): " + ", ".join(calls))
    for r in ours:
        print(
            f"extender {r.round}: its own time per call p50 / p99 (ms): "
            + ", ".join(
                f"{verb} {q.get('p50', 0):.2f} / {q.get('p99', 0):.2f}"
                for verb, q in r.extender_verb_ms.items()
            )
        )
    payload = {
        "benchmark": "e2e_throughput",
        "nodes": nodes,
        "results": [asdict(r) for r in results],
        "extender_over_baseline": round(ratio, 3),
        "extender_over_baseline_per_round": per_round,
        "median_pods_per_s": {"baseline": round(baseline_rate, 1), "extender": round(extender_rate, 1)},
        **phase_medians(results),
        **cost,
        "extender_mean_ms_per_verb": verbs["mean_ms"],
        "extender_calls_per_verb": verbs["calls"],
    }
    write_results(results_path(nodes).stem, payload, module="benchmarks.e2e_throughput", argv=argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help="baseline+extender phase pairs (the ratio takes the medians)",
    )
    parser.add_argument("--profile", type=Path, help="record the first extender phase with py-spy here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gpuweave-e2e-bench-") as work:
        results, verbs = run(args.nodes, args.pods, Path(work), rounds=args.rounds, profile=args.profile)
    report(results, verbs, nodes=args.nodes, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
