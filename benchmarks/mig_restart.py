"""MIG restart benchmark: how soon a restarted node agent serves its GPUs while a MIG restore runs.

A simulated DGX H100 node agent (real gRPC servers, the kubelet emulator, the production MIG
wiring) restarts after a reboot: the journal says GPU 3 is 3g.40gb x2, the hardware shows a whole
GPU. Measured from the agent's start: when the kubelet sees the 7 other GPUs healthy, and when
GPU 3's two MIG devices are healthy. Two start-up orders run in the same process on fresh state:

- ``restore-first``: ``MigService.start()`` (the restore) before ``agent.start()``;
- ``background`` (what ``gpuweave node-agent`` does): ``begin_restore()`` withholds GPU 3,
  ``agent.start()`` serves, ``restore_in_background()`` restores GPU 3.

The simulated driver's latency per MIG call is a parameter.

    .venv/bin/python -m benchmarks.mig_restart [--latency-ms 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.results_file import write_results
from devicemodel.contracts import RESOURCE_GPU, mig_resource_name
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.mig import build_mig_service
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from mig.planner import TargetEntry
from nodeagent.agent import AgentConfig
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.sim_mig import mig_reconciler

LAYOUT = [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")]


def journal_gpu3(root: Path) -> None:
    """A first life that reshaped GPU 3, leaving its journal in ``root / "s"``."""
    backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs-old")
    backend.discover()
    mig_reconciler(backend.lib, backend.inventory, root / "s").apply(3, LAYOUT)
    backend.close()


def one_start(order: str, *, latency_s: float) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="gwb", dir="/tmp"))
    try:
        journal_gpu3(root)
        backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs")  # rebooted: GPU 3 whole
        backend.discover()
        backend.lib.mig_latency_s = latency_s
        kubelet = KubeletEmulator(root / "k")
        kubelet.start()
        others = {g.uuid for g in backend.inventory.gpus if g.index != 3}
        agent = device_plugin_agent(
            AgentConfig(kubelet_dir=root / "k", state_dir=root / "s"), discover=backend.discover
        )
        started = time.monotonic()
        mig = build_mig_service(agent, backend=backend, state_dir=root / "s", inventory=backend.discover())
        if order == "restore-first":
            mig.start()
            agent.start()
        else:
            mig.begin_restore()
            agent.start()
            mig.restore_in_background()
        assert kubelet.wait_for(lambda: others <= kubelet.healthy(RESOURCE_GPU), timeout=600)
        served = time.monotonic() - started
        assert kubelet.wait_for(lambda: len(kubelet.healthy(mig_resource_name("3g.40gb"))) == 2, timeout=600)
        restored = time.monotonic() - started
        agent.stop()
        kubelet.stop()
        backend.close()
        return {"others_served_s": served, "gpu3_restored_s": restored}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=200.0, help="simulated time per MIG call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, Any] = {}
    for order in ("restore-first", "background"):
        runs = [one_start(order, latency_s=args.latency_ms / 1000) for _ in range(args.rounds)]
        rows[order] = {key: statistics.median(r[key] for r in runs) for key in runs[0]} | {"runs": runs}
    print(f"MIG call latency {args.latency_ms:g} ms, {args.rounds} rounds, medians (s)")
    print(f"{'order':<14} {'7 GPUs served':>14} {'GPU 3 restored':>15}")
    for order, row in rows.items():
        print(f"{order:<14} {row['others_served_s']:>14.2f} {row['gpu3_restored_s']:>15.2f}")
    report = {"latency_ms": args.latency_ms, "rounds": args.rounds, "orders": rows}
    write_results("mig_restart", report, module="benchmarks.mig_restart")


if __name__ == "__main__":
    main()
