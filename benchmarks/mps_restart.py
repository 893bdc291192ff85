"""MPS supervision benchmark: how fast a dead daemon is restarted, and whether its GPU is withheld.

The real node-agent process on a simulated four-GPU node (GPUs 0 and 1 fractional), the kubelet
emulator and our own ListAndWatch stream of ``gpuweave.io/gpu-compute``. Each trial kills GPU 0's
MPS control daemon (``gpuweave sim inject --kill-mps-daemon``, SIGKILL) and measures, from the
moment the kill returned:

- ``restart_s``: until ``mps.status`` shows GPU 0's daemon up with a new pid (the restarted
  daemon answered), polled every 20 ms;
- ``withheld_lists``: how many lists of the kubelet's stream held a GPU 0 share Unhealthy.

It also times one daemon start (``-f``, first answer, default limits set) of the simulated
control program on its own. Run at each health round interval given (the agent's default is 5 s).

    .venv/bin/python -m benchmarks.mps_restart [--round 5 --round 1] [--trials 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks.results_file import write_results
from devicemodel.contracts import RESOURCE_GPU_COMPUTE
from hardware.mps import MpsDaemonSpec, simulated_command
from hardware.mps_process import ProcessMpsDaemons
from tests.support.agent_node import run_sim_inject
from tests.support.agent_process import remove_tree, short_temp_dir
from tests.support.device_watch import Watch
from tests.support.mps_node import MpsNode, shares_healthy
from tests.support.small_inventory import gpu_uuid
from tests.support.waiting import poll_until


def one_kill(node: MpsNode, watch: Watch, *, delay_s: float) -> dict[str, float]:
    time.sleep(delay_s)  # spread the kills over the round, so they do not all land just after one
    start = len(watch.lists)
    old_pid = node.mps_status()[gpu_uuid(0)]["pid"]
    done = run_sim_inject(node.state_dir, "--gpu", "0", "--kill-mps-daemon")
    killed = time.monotonic()
    if done.returncode != 0:
        raise RuntimeError(f"sim inject failed: {done.stderr.strip()}")

    def restarted() -> bool:
        gpu = node.mps_status()[gpu_uuid(0)]
        return bool(gpu["up"]) and gpu["pid"] not in (None, old_pid)

    if not poll_until(restarted, timeout=60, every=0.02):
        raise RuntimeError("GPU 0's daemon was not restarted within 60 s")
    restart_s = time.monotonic() - killed
    withheld = sum(1 for devices in watch.lists[start:] if not shares_healthy(0)(devices))
    return {"restart_s": restart_s, "withheld_lists": float(withheld)}


def at_round(round_s: float, trials: int) -> dict[str, Any]:
    node = MpsNode(round_s=round_s)
    try:
        if not node.kubelet.wait_for(lambda: len(node.kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 200, 30):
            raise RuntimeError("the agent did not serve 200 healthy compute shares within 30 s")
        watch = Watch(node, RESOURCE_GPU_COMPUTE)
        try:
            watch.wait(shares_healthy(0))
            offsets = [round_s * (i + 0.5) / trials for i in range(trials)]
            runs = [one_kill(node, watch, delay_s=offset) for offset in offsets]
        finally:
            watch.close()
    finally:
        node.kill_leftover_daemons()
        node.close()
    return {"round_interval_s": round_s, "trials": runs, **_summary(runs)}


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    out = {}
    for key in ("restart_s", "withheld_lists"):
        values = [r[key] for r in runs]
        out[f"{key}_median"] = statistics.median(values)
        out[f"{key}_max"] = max(values)
    return out


def daemon_start(trials: int) -> dict[str, float]:
    root = short_temp_dir()
    daemons = ProcessMpsDaemons(simulated_command())
    times = []
    try:
        for n in range(trials):
            spec = MpsDaemonSpec(f"GPU-{n}", root / str(n) / "pipe", root / str(n) / "log", 50, 1024)
            began = time.monotonic()
            daemons.start(spec)
            times.append(time.monotonic() - began)
            daemons.stop(spec)
    finally:
        remove_tree(root)
    return {"start_s_median": statistics.median(times), "start_s_max": max(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round", type=float, action="append", help="health round interval (s)")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    rounds = args.round or [5.0, 1.0]
    start = daemon_start(args.trials)
    kills = [at_round(r, args.trials) for r in rounds]
    report = {"daemon_start": start, "kills": kills}
    write_results("mps_restart", report, module="benchmarks.mps_restart", argv=argv)
    print(f"daemon start (simulated -f to answer, limits set): median {start['start_s_median']:.3f} s")
    print(f"{'round s':>8} {'restart med':>12} {'restart max':>12} {'withheld lists max':>19}")
    for row in kills:
        restart = f"{row['restart_s_median']:>12.3f} {row['restart_s_max']:>12.3f}"
        print(f"{row['round_interval_s']:>8.1f} {restart} {row['withheld_lists_max']:>19.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
