"""Extender HTTP servers compared: the stdlib ``http.server`` adapter the extender ships against an
asyncio server (aiohttp: present in the development virtualenv, not a runtime dependency) over
the same ``ExtenderService``.

Both serve from a forked child over one 500-node cluster (``benchmarks.extender.build_cluster``);
the parent is the client. Two loads, kept small for a shared machine:

- ``keep-alive``: ``--connections`` client threads, each on one keep-alive connection, send
  ``--requests`` filter calls each (a 1-GPU pod, all node names), as kube-scheduler's pool does;
- ``burst``: ``--burst`` simultaneous new connections, one bind each (an unknown pod: the answer
  is an in-band error, so this measures connection handling, not binding).

Writes ``benchmarks/results/extender_servers.json`` and prints a table.

    .venv/bin/python -m benchmarks.extender_servers [--connections 4] [--requests 100] [--burst 200]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from benchmarks.extender import build_cluster, percentile
from benchmarks.results_file import write_results
from devicemodel.contracts import RESOURCE_GPU
from gpuweave.simulate.cluster_objects import pod_object
from scheduler_ext.api import (
    Extender,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    decode_body,
    encode_filter_result,
    parse,
)


def serve_stdlib(extender: Extender, ready: Any, stop: Any) -> None:
    extender.serve(host="127.0.0.1", port=0)
    assert extender.server is not None
    ready.put(extender.server.server_address[1])
    stop.wait()
    extender.close()


def serve_aiohttp(extender: Extender, ready: Any, stop: Any) -> None:
    """The same verbs as an aiohttp app; decisions run on the event loop (they hold the GIL)."""
    service = extender.service

    async def filter_verb(request: web.Request) -> web.Response:
        body = decode_body(await request.read())
        assert isinstance(body, dict)
        result = service.filter(parse(ExtenderArgs, body), body["Pod"])
        return web.Response(body=encode_filter_result(result), content_type="application/json")

    async def bind_verb(request: web.Request) -> web.Response:
        args = parse(ExtenderBindingArgs, decode_body(await request.read()))
        payload = ExtenderBindingResult(Error=service.bind(args)).model_dump_json()
        return web.Response(text=payload, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/filter", filter_verb)
        app.router.add_post("/bind", bind_verb)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        ready.put(runner.addresses[0][1])
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await runner.cleanup()

    asyncio.run(main())


def keep_alive(port: int, names: list[str], *, connections: int, requests: int) -> dict[str, float]:
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(connections + 1)

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"Pod": pod_object(f"ka-{index}", limits={RESOURCE_GPU: 1}), "NodeNames": names})
        mine = []
        start.wait()
        for _ in range(requests):
            began = time.perf_counter()
            connection.request("POST", "/filter", body=body.encode())
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            mine.append(time.perf_counter() - began)
        connection.close()
        with lock:
            latencies.extend(mine)

    began = _run_threads(client, connections, start)
    wall = time.perf_counter() - began
    return {
        "requests_per_s": len(latencies) / wall,
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
    }


def burst(port: int, *, count: int) -> dict[str, float]:
    answered: list[int] = []
    start = threading.Barrier(count + 1)

    def client(index: int) -> None:
        start.wait()
        body = json.dumps(
            {"PodName": f"b{index}", "PodNamespace": "default", "PodUID": f"u{index}", "Node": "x"}
        )
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            connection.request("POST", "/bind", body=body.encode())
            response = connection.getresponse()
            response.read()
            connection.close()
            answered.append(response.status)
        except OSError:
            pass

    began = _run_threads(client, count, start)
    return {"answered": float(answered.count(200)), "of": float(count), "wall_s": time.perf_counter() - began}


def _run_threads(target: Callable[[int], None], count: int, start: threading.Barrier) -> float:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return began


def measure(server: Callable[[Extender, Any, Any], None], args: argparse.Namespace) -> dict[str, Any]:
    extender = build_cluster(500, rng=random.Random(7))
    names = extender.cache.node_names()
    context = multiprocessing.get_context("fork")
    ready, stop = context.Queue(), context.Event()
    child = context.Process(target=server, args=(extender, ready, stop), daemon=True)
    child.start()
    gc.freeze()
    try:
        port = ready.get(timeout=60)
        keep_alive(port, names, connections=1, requests=10)  # warm-up, untimed
        return {
            "keep_alive": keep_alive(port, names, connections=args.connections, requests=args.requests),
            "burst": burst(port, count=args.burst),
        }
    finally:
        stop.set()
        child.join(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--requests", type=int, default=100, help="filter calls per connection")
    parser.add_argument("--burst", type=int, default=200, help="simultaneous new connections")
    args = parser.parse_args(argv)
    results = {"stdlib": measure(serve_stdlib, args), "aiohttp": measure(serve_aiohttp, args)}
    print(f"{'server':8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'burst answered':>15} {'burst s':>8}")
    for name, result in results.items():
        ka, b = result["keep_alive"], result["burst"]
        print(
            f"{name:8} {ka['requests_per_s']:8.0f} {ka['p50_ms']:8.2f} {ka['p99_ms']:8.2f} "
            f"{int(b['answered']):>9}/{int(b['of']):<5} {b['wall_s']:8.2f}"
        )
    report = {"args": vars(args), "results": results}
    write_results("extender_servers", report, module="benchmarks.extender_servers", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
