"""Extender latency: filter+prioritize at 500, 5,000 and 15,000 nodes, in-process and over HTTP.

The cluster mixes the built-in machine profiles, some nodes with shared GPUs, and is pre-loaded
with bound pods so node states differ. Each measured pod is one filter call with every node name
(``percentageOfNodesToScore: 100``, the worst case kube-scheduler sends with
``nodeCacheCapable: true``), in a new order for each pod (kube-scheduler's filter runs on 16
goroutines and lists the feasible nodes in the order they finish), and one prioritize call with
the nodes that passed (at most ``--shortlist``, as the deployed extender passes); the pod is then
bound, so states keep changing and the memo sees misses as it would in a cluster.

- ``in-process``: JSON decode, validation, decisions and JSON encode, no socket;
- ``http``: the same bodies over a keep-alive HTTP/1.1 connection to the extender serving in its
  own process (forked from the same cluster, fed the same binds, as kube-scheduler would call it);
- ``json-floor``: ``json.loads`` + ``json.dumps`` (stdlib) of the same request and response bodies,
  the floor an extender using the standard library pays (the target is HTTP p99 <= 4x this floor
  and <= 20 ms at 5,000 nodes); the extender itself decodes and encodes with orjson, so it can
  come in under this floor;
- ``bare-server``: the same request bodies over keep-alive HTTP/1.1 to a bare stdlib
  ``http.server`` in its own process that only decodes each request with ``json`` and encodes the
  extender's answer to it (handed over beforehand, untimed): the floor of serving these bodies
  with the standard library, against which the extender's ``http`` p50 is compared (target
  <= 2.5x at 5,000 nodes).

Writes ``benchmarks/results/extender.json`` and prints a table.

    .venv/bin/python -m benchmarks.extender [--sizes 500,5000,15000] [--pods N] [--seed S]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks.results_file import write_results
from devicemodel.contracts import ANNOTATION_PLACEMENT, RESOURCE_EFA, RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from devicemodel.sharing import GpuSharing, SharingMode
from gpuweave.simulate.cluster_objects import node_object, pod_object, profile_inventory, unique_uuids
from scheduler_ext.api import (
    DEFAULT_KEEP,
    Extender,
    ExtenderArgs,
    ExtenderBindingArgs,
    InventoryRecord,
    PriorityEncoder,
    SnapshotBinder,
    assemble,
    build_core,
    decode_body,
    encode_filter_result,
    parse,
)

PROFILES = (
    "p5.48xlarge",
    "p4d.24xlarge",
    "dgx-a100",
    "dgx-h100",
    "dgx1-v100",
    "l40s-pcie-8",
    "a100-pcie-nvbridge-4",
)
POD_MIX: tuple[tuple[dict[str, int], dict[str, str]], ...] = (
    ({RESOURCE_GPU: 1}, {}),
    ({RESOURCE_GPU: 2}, {}),
    ({RESOURCE_GPU: 4}, {ANNOTATION_PLACEMENT: "nvlink-required"}),
    ({RESOURCE_GPU: 8}, {}),
    ({RESOURCE_GPU: 4, RESOURCE_EFA: 4}, {ANNOTATION_PLACEMENT: "nic-aligned"}),
    ({RESOURCE_GPU_COMPUTE: 25}, {}),
)


@dataclass(frozen=True)
class Row:
    nodes: int
    mode: str
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float


def build_cluster(size: int, *, rng: random.Random, keep: int = DEFAULT_KEEP) -> Extender:
    cache, core = build_core()
    templates = {p: profile_inventory(p, p) for p in PROFILES}
    for i in range(size):
        profile = PROFILES[i % len(PROFILES)]
        name = f"node-{i:05d}"
        inventory = unique_uuids(templates[profile], salt=name)
        inventory = type(inventory)(**{**inventory.__dict__, "name": name})
        shared = i % 10 == 0  # every tenth node offers two GPUs as fractional shares
        sharing = {str(g): GpuSharing(SharingMode.FRACTIONAL) for g in (0, 1)} if shared else {}
        cache.upsert_node(node_object(name, gpus=len(inventory.gpus)))
        cache.put_inventory(InventoryRecord(name, inventory, frozenset(), sharing))
    cache.synced.set()
    extender = assemble(cache, core, SnapshotBinder(cache), keep=keep)
    preload(extender, size, rng=rng)
    return extender


def preload(extender: Extender, size: int, *, rng: random.Random) -> None:
    """Bind a pod to about half the nodes so free states vary (1, 2 or 4 GPUs held)."""
    for i in range(size):
        if rng.random() < 0.5:
            continue
        gpus = rng.choice((1, 2, 4))
        pod = pod_object(f"pre-{i}", limits={RESOURCE_GPU: gpus})
        extender.cache.remember_pod(pod)
        extender.service.bind(
            ExtenderBindingArgs(
                PodName=f"pre-{i}",
                PodNamespace="default",
                PodUID=pod["metadata"]["uid"],
                Node=f"node-{i:05d}",
            )
        )


def in_process(extender: Extender) -> Callable[[str, bytes], bytes]:
    service = extender.service
    priorities = PriorityEncoder()

    def call(verb: str, body: bytes) -> bytes:
        decoded = decode_body(body)
        assert isinstance(decoded, dict)
        args = parse(ExtenderArgs, decoded)
        if verb == "filter":
            return encode_filter_result(service.filter(args, decoded["Pod"]))
        hosts, scores = service.prioritize(args, decoded["Pod"])
        return priorities.encode(hosts, scores)

    return call


def over_http(connection: http.client.HTTPConnection) -> Callable[[str, bytes], bytes]:
    def call(verb: str, body: bytes) -> bytes:
        connection.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{verb} answered {response.status}: {data[:200]!r}")
        return data

    return call


def one_pod(
    call: Callable[[str, bytes], bytes], pod: dict[str, Any], names: list[str]
) -> tuple[float, list[bytes]]:
    """Time filter+prioritize for one pod (the two calls only: building the second request is
    kube-scheduler's work); returns seconds and the four bodies (for the JSON floor)."""
    filter_body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    started = time.perf_counter()
    filtered = call("filter", filter_body)
    elapsed = time.perf_counter() - started
    passed = json.loads(filtered)["NodeNames"]
    prioritize_body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode()
    started = time.perf_counter()
    scores = call("prioritize", prioritize_body)
    elapsed += time.perf_counter() - started
    return elapsed, [filter_body, filtered, prioritize_body, scores]


def json_floor(bodies: list[bytes]) -> float:
    started = time.perf_counter()
    for body in bodies:
        json.dumps(json.loads(body))
    return time.perf_counter() - started


def best_node(scores_body: bytes) -> str | None:
    scores = json.loads(scores_body)
    return max(scores, key=lambda s: (s["Score"], s["Host"]))["Host"] if scores else None


def binding_body(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}


class BareHandler(BaseHTTPRequestHandler):
    """Decodes the request's JSON and encodes the stored answer for its pod and verb; no decisions."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no delayed-ACK stall
    server: BareServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/answers":
            self.server.answers[(body["verb"], body["uid"])] = body["answer"]
            out = b"{}"
        else:
            out = json.dumps(
                self.server.answers[(self.path.strip("/"), body["Pod"]["metadata"]["uid"])]
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: Any) -> None:
        return


class BareServer(ThreadingHTTPServer):
    daemon_threads = True
    answers: dict[tuple[str, str], Any]


def serve_bare_in_child(ready: Any, stop: Any) -> None:
    server = BareServer(("127.0.0.1", 0), BareHandler)
    server.answers = {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ready.put(server.server_address[1])
    stop.wait()
    server.shutdown()


def bare_pod(call: Callable[[str, bytes], bytes], pod: dict[str, Any], bodies: list[bytes]) -> float:
    """The extender's two request bodies for ``pod`` against the bare server, which first gets the
    extender's answers (untimed); seconds for the two timed calls."""
    uid = pod["metadata"]["uid"]
    for verb, answer in (("filter", bodies[1]), ("prioritize", bodies[3])):
        call("answers", json.dumps({"verb": verb, "uid": uid, "answer": json.loads(answer)}).encode())
    started = time.perf_counter()
    call("filter", bodies[0])
    call("prioritize", bodies[2])
    return time.perf_counter() - started


def serve_in_child(extender: Extender, ready: Any, stop: Any) -> None:
    """The HTTP side runs in its own (forked) process, as kube-scheduler's extender does."""
    gc.freeze()
    extender.serve(host="127.0.0.1", port=0)
    assert extender.server is not None
    ready.put(extender.server.server_address[1])
    stop.wait()
    extender.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(size: int, *, pods: int, seed: int, keep: int = DEFAULT_KEEP) -> list[Row]:
    """Both sides start from one cluster (built, then forked) and see the same pods and binds."""
    extender = build_cluster(size, rng=random.Random(seed), keep=keep)
    names = extender.cache.node_names()
    context = multiprocessing.get_context("fork")
    ready, stop = context.Queue(), context.Event()
    child = context.Process(target=serve_in_child, args=(extender, ready, stop), daemon=True)
    child.start()
    bare_ready, bare_stop = context.Queue(), context.Event()
    bare = context.Process(target=serve_bare_in_child, args=(bare_ready, bare_stop), daemon=True)
    bare.start()
    gc.freeze()
    connection = http.client.HTTPConnection("127.0.0.1", ready.get(timeout=60), timeout=60)
    bare_connection = http.client.HTTPConnection("127.0.0.1", bare_ready.get(timeout=60), timeout=60)
    bare_call = over_http(bare_connection)
    modes: dict[str, list[float]] = {"in-process": [], "http": [], "json-floor": [], "bare-server": []}
    callers = {"in-process": in_process(extender), "http": over_http(connection)}
    try:
        for i in range(len(POD_MIX)):  # warm-up: one of each request shape on both sides, untimed
            limits, annotations = POD_MIX[i]
            warm = pod_object(f"warm-{i}", limits=limits, annotations=annotations)
            for caller in callers.values():
                one_pod(caller, warm, names)
            bare_pod(bare_call, warm, one_pod(callers["http"], warm, names)[1])
        order = random.Random(seed)
        for i in range(pods):
            limits, annotations = POD_MIX[i % len(POD_MIX)]
            pod = pod_object(f"bench-{i}", limits=limits, annotations=annotations)
            order.shuffle(names)  # kube-scheduler's parallel filter lists feasible nodes as they finish
            results = {mode: one_pod(caller, pod, names) for mode, caller in callers.items()}
            for mode, (elapsed, _) in results.items():
                modes[mode].append(elapsed)
            bodies = results["http"][1]
            modes["json-floor"].append(json_floor(bodies))
            modes["bare-server"].append(bare_pod(bare_call, pod, bodies))
            node = best_node(bodies[3])
            if node is not None:  # the same bind on both sides keeps their states equal
                extender.service.bind(ExtenderBindingArgs.model_validate(binding_body(pod, node)))
                callers["http"]("bind", json.dumps(binding_body(pod, node)).encode())
    finally:
        connection.close()
        bare_connection.close()
        stop.set()
        bare_stop.set()
        child.join(timeout=30)
        bare.join(timeout=30)
    return [
        Row(
            size,
            mode,
            len(values),
            percentile(values, 0.5) * 1e3,
            percentile(values, 0.99) * 1e3,
            sum(values) / len(values) * 1e3,
        )
        for mode, values in modes.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="500,5000,15000", help="comma-separated node counts")
    parser.add_argument("--pods", type=int, default=150, help="measured pods per cluster size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--shortlist",
        type=int,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"the extender's filter shortlist, as `gpuweave extender --shortlist` (default {DEFAULT_KEEP})",
    )
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for size in (int(s) for s in args.sizes.split(",")):
        print(f"measuring {size} nodes ...", flush=True)
        rows += measure(size, pods=args.pods, seed=args.seed, keep=args.shortlist)
    floors = {r.nodes: r for r in rows if r.mode == "json-floor"}
    bare = {r.nodes: r for r in rows if r.mode == "bare-server"}
    header = ("nodes", "mode", "samples", "p50 ms", "p99 ms", "mean ms", "p99/floor", "p50/bare")
    print("\n{:>6} {:<11} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8}".format(*header))
    for row in rows:
        ratio = row.p99_ms / floors[row.nodes].p99_ms if floors[row.nodes].p99_ms else 0.0
        over_bare = row.p50_ms / bare[row.nodes].p50_ms if bare[row.nodes].p50_ms else 0.0
        print(
            f"{row.nodes:>6} {row.mode:<11} {row.samples:>7} {row.p50_ms:>8.2f} {row.p99_ms:>8.2f} "
            f"{row.mean_ms:>8.2f} {ratio:>9.2f} {over_bare:>8.2f}"
        )
    report = {
        "benchmark": "extender filter+prioritize",
        "shortlist": args.shortlist,
        "targets": {
            "http_p99_ms_at_5000": 20.0,
            "http_p99_over_json_floor": 4.0,
            "http_p50_over_bare_server_at_5000": 2.5,
        },
        "http_p50_over_bare_server": {
            str(size): round(r.p50_ms / bare[size].p50_ms, 2)
            for size, r in ((r.nodes, r) for r in rows if r.mode == "http")
            if bare[size].p50_ms
        },
        "rows": [asdict(r) for r in rows],
    }
    write_results("extender", report, module="benchmarks.extender", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
