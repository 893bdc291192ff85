"""What a share tenant that quits its GPU's MPS daemon again and again costs the GPU's other tenants.

The real node-agent process on a simulated four-GPU node (GPUs 0 and 1 fractional, the simulated
``nvidia-cuda-mps-control`` run as processes), the kubelet emulator and our own ListAndWatch
stream of ``gpuweave.io/gpu-compute``. For ``--seconds`` of real time:

- a tenant of GPU 0 sends its daemon ``quit`` every ``--quit-every`` seconds (the control client
  on the pipe directory Allocate mounts into its container);
- a co-tenant asks for a share of GPU 0 every ``--allocate-every`` seconds (Allocate over gRPC,
  as the kubelet admits a pod), and one of GPU 1 likewise.

Reported: the fraction of the time the kubelet's stream listed GPU 0's shares withheld (any of
them not Healthy), the fraction of the co-tenant's Allocates refused, their latency, and the same
for GPU 1 (whose daemon the tenant cannot reach). It uses only what the agent's tests use, so it
runs against any checkout: ``PYTHONPATH=CHECKOUT python benchmarks/mps_quit_tenant.py``.

    .venv/bin/python -m benchmarks.mps_quit_tenant [--seconds 40] [--quit-every 2] [--round 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import grpc

from benchmarks.results_file import RESULTS_DIR, write_results
from devicemodel.contracts import RESOURCE_GPU_COMPUTE
from hardware.mps import simulated_command
from hardware.simulated import mps_control
from tests.support.agent_process import remove_tree
from tests.support.device_watch import Watch
from tests.support.mps_node import MpsNode
from tests.support.small_inventory import gpu_uuid

RESULTS = RESULTS_DIR / "mps_quit_tenant.json"


def quit_daemon(pipe: Path) -> None:
    """The tenant: ``echo quit | nvidia-cuda-mps-control`` on its GPU's pipe directory."""
    env = {**os.environ, mps_control.PIPE_ENV: str(pipe)}
    command = simulated_command()
    subprocess.run(command, input="quit\n", text=True, env=env, capture_output=True, timeout=30, check=False)


def tenant(node: MpsNode, *, every_s: float, stop: threading.Event) -> list[float]:
    sent = []
    while not stop.wait(every_s):
        sent.append(time.monotonic())
        quit_daemon(node.pipe_dir(0))
    return sent


def co_tenant(node: MpsNode, gpu: int, *, every_s: float, stop: threading.Event) -> list[dict[str, Any]]:
    asked = []
    while not stop.is_set():
        began = time.monotonic()
        try:
            node.allocate(node.share_ids(gpu, count=10))
            granted = True
        except grpc.RpcError:
            granted = False
        asked.append({"at": began, "granted": granted, "latency_s": time.monotonic() - began})
        stop.wait(every_s)
    return asked


def withheld_fraction(watch: Watch, gpu: int, start: float, end: float) -> float:
    """Share of [start, end] during which the latest list had a share of ``gpu`` not Healthy."""
    prefix = gpu_uuid(gpu)

    def withheld(devices: dict[str, str]) -> bool:
        return any(h != "Healthy" for i, h in devices.items() if i.startswith(prefix))

    state, last, total = False, start, 0.0
    for at, devices in zip(watch.times, watch.lists, strict=True):
        if at <= start:
            state = withheld(devices)
            continue
        if at >= end:
            break
        total += (at - last) if state else 0.0
        state, last = withheld(devices), at
    total += (end - last) if state else 0.0
    return total / (end - start)


def drain(stream: Any, tail: deque[str]) -> None:
    """Read the agent's log as it comes (a full pipe would block the agent's logging)."""
    for line in iter(stream.readline, b""):
        tail.append(line.decode(errors="replace").rstrip())


def summary(asked: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = sorted(a["latency_s"] for a in asked)
    refused = sum(1 for a in asked if not a["granted"])
    return {
        "allocates": len(asked),
        "refused": refused,
        "refused_fraction": refused / len(asked) if asked else 0.0,
        "latency_s_median": statistics.median(latencies) if latencies else 0.0,
        "latency_s_max": latencies[-1] if latencies else 0.0,
    }


def run(seconds: float, *, quit_every: float, allocate_every: float, round_s: float) -> dict[str, Any]:
    node = MpsNode(round_s=round_s)
    tail: deque[str] = deque(maxlen=50)
    threading.Thread(target=drain, args=(node.agent.process.stderr, tail), daemon=True).start()
    try:
        if not node.kubelet.wait_for(lambda: len(node.kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 200, 60):
            raise RuntimeError("the agent did not serve 200 healthy compute shares within 60 s")
        return measure(node, seconds, quit_every=quit_every, allocate_every=allocate_every)
    finally:
        node.agent.stop()
        node.kill_leftover_daemons()
        node.kubelet.stop()
        remove_tree(node.root)


def measure(node: MpsNode, seconds: float, *, quit_every: float, allocate_every: float) -> dict[str, Any]:
    watch = Watch(node, RESOURCE_GPU_COMPUTE)
    stop = threading.Event()
    quits: list[float] = []
    asked: dict[int, list[dict[str, Any]]] = {}

    def asking(gpu: int) -> None:
        asked[gpu] = co_tenant(node, gpu, every_s=allocate_every, stop=stop)

    workers = [
        threading.Thread(target=lambda: quits.extend(tenant(node, every_s=quit_every, stop=stop))),
        threading.Thread(target=asking, args=(0,)),
        threading.Thread(target=asking, args=(1,)),
    ]
    start = time.monotonic()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    end = time.monotonic()
    stop.set()
    for worker in workers:
        worker.join(60)
    status = node.mps_status()
    watch.close()
    return {
        "seconds": end - start,
        "quits": len(quits),
        "gpu0": {"withheld_fraction": withheld_fraction(watch, 0, start, end), **summary(asked[0])},
        "gpu1": {"withheld_fraction": withheld_fraction(watch, 1, start, end), **summary(asked[1])},
        "restarts": {gpu: status[gpu_uuid(gpu)]["restarts"] for gpu in (0, 1)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--quit-every", type=float, default=2.0)
    parser.add_argument("--allocate-every", type=float, default=0.1)
    parser.add_argument("--round", type=float, default=5.0, help="health round (s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    every = {"quit_every": args.quit_every, "allocate_every": args.allocate_every}
    row = run(args.seconds, **every, round_s=args.round)
    module = "benchmarks.mps_quit_tenant"
    write_results(args.out.stem, row, module=module, argv=argv, directory=args.out.parent)
    print(f"{row['seconds']:.1f} s, {row['quits']} quits of GPU 0's daemon, restarts {row['restarts']}")
    header = f"{'GPU':>4} {'withheld':>9} {'allocates':>10} {'refused':>8}"
    print(f"{header} {'latency med':>12} {'latency max':>12}")
    for gpu in ("gpu0", "gpu1"):
        r = row[gpu]
        print(
            f"{gpu[-1]:>4} {r['withheld_fraction']:>9.1%} {r['allocates']:>10} {r['refused_fraction']:>8.1%} "
            f"{r['latency_s_median']:>12.3f} {r['latency_s_max']:>12.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
