"""The same seed gives the same report under any machine load.

The simulation's node agents run real threads (NVML event listener, the kubelets' ListAndWatch
streams, a GPU reset); nothing the simulation decides may hang on how fast they run
(``gpuweave.simulate.agents``). One short run with agents and faults (an Xid, an ECC error whose
GPU comes back through the agent's reset and probation rounds, an EFA loss), run alone and then
next to processes spinning on every core, must give the same figures (``simulated_figures``:
all but the wall-clock measurements).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import mig_resource_name
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.report import simulated_figures
from gpuweave.simulate.runner import SimulateOptions, run_simulation
from gpuweave.simulate.workload import Job, JobKind
from tests.support.sim_agents import simulation_with_agents

pytestmark = pytest.mark.slow

SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"
RUN = ["simulate", "--nodes", "4", "--duration", "1h", "--seed", "7", "--no-compare", "--no-progress"]


@contextlib.contextmanager
def busy_cores(seconds: float) -> Iterator[int]:
    """A process spinning on each core this test may use (at most 8), for at most ``seconds``."""
    cores = min(len(os.sched_getaffinity(0)), 8)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)]) for _ in range(cores)]
    try:
        yield cores
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _run(out: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gpuweave", *RUN, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "health.monitor" not in done.stderr  # the agents' transitions are the report's fault lines
    return simulated_figures(json.loads((out / "report.json").read_text()))


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(a.keys() | b.keys())
        return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_a_seed_gives_the_same_report_alone_and_next_to_a_busy_loop(tmp_path: Path) -> None:
    quiet = _run(tmp_path / "quiet")
    with busy_cores(600.0):
        loaded = _run(tmp_path / "loaded")
    faults = quiet["summaries"][0]["faults"]
    assert any(f["health_rounds"] for f in faults), faults  # a GPU came back through the agent's rounds
    assert quiet["summaries"][0]["node_agents"] == "4 agents (gRPC)"
    assert _differences(quiet, loaded) == []


# One 1g.10gb pod at a time on one DGX A100, each ending long enough before the next that its GPU
# went back to a whole GPU (``MigManager``'s idle revert, 1800 s): each next pod needs its GPU
# switched to MIG mode again, whose new devices the agent lists withheld (the GPU changing mode)
# and then releases, while the kubelet's nvidia.com/mig-1g.10gb list was empty. The kubelet must
# see them released before it admits the pod: one admitted between the two listings was refused
# (its GetPreferredAllocation offered no Healthy device), on a share of the cycles that depended
# on the machine's load, and its job started a tick later.
MIG_CYCLES = 4
MIG_CYCLE_S = 1920.0  # the pod's 60 s, the 1800 s idle revert, a tick to spare
MIG = mig_resource_name("1g.10gb")


def _mig_cycles() -> dict[str, Any]:
    fleet = build_fleet(["dgx-a100"], nodes=1)
    jobs = [
        Job(f"mig-{i}", JobKind.MIG, i * MIG_CYCLE_S, 60.0, 1, 1, 0, 4000, 16_384, "1g.10gb")
        for i in range(MIG_CYCLES)
    ]
    with simulation_with_agents(fleet, jobs, duration_s=MIG_CYCLES * MIG_CYCLE_S) as (sim, pool, _):
        result = sim.run()
    return {
        "admissions": result.admissions,
        "refused": result.admission_failures,
        "refusals": pool.admission_failures,
        "pending_s": result.pending_times_s,
        "reshapes": [(r.at_s, r.gpu, r.created, r.destroyed) for r in result.reshapes],
        "mismatches": result.placement_mismatches,
    }


def test_mig_pods_after_their_gpu_switched_to_mig_give_the_same_run_alone_and_next_to_a_busy_loop() -> None:
    quiet = _mig_cycles()
    with busy_cores(600.0):
        loaded = _mig_cycles()
    # every cycle switched a GPU to MIG mode for its pod and back to a whole GPU afterwards
    assert sum(1 for r in quiet["reshapes"] if r[2]) == MIG_CYCLES, quiet["reshapes"]
    assert sum(1 for r in quiet["reshapes"] if r[3]) >= MIG_CYCLES - 1, quiet["reshapes"]
    for run in (quiet, loaded):  # each pod admitted at its arrival, its first try
        assert run["refusals"] == [] and run["refused"] == 0
        assert run["admissions"] == MIG_CYCLES and run["pending_s"] == [0.0] * MIG_CYCLES
    assert _differences(quiet, loaded) == []


def test_a_mig_pod_admitted_right_after_its_gpu_switched_to_mig_is_never_refused() -> None:
    """The race itself, without the extender's round trips that made it rare in a run: the pod
    is admitted the moment the reshape returns, on a busy machine. Before the pool waited for the
    kubelet to list the new device as the agent serves it, about half of these were refused."""
    pool = NodeAgentPool(build_fleet(["dgx-a100"], nodes=1), share_nodes=frozenset())
    try:
        with busy_cores(600.0):
            for cycle in range(6):
                assert pool.reshape(0, 0, [("1g.10gb", 0)])
                device = pool.inventory(0).mig_devices_of(0)[0].uuid
                assert pool.kubelet_follows(0)
                assert pool.admit(0, {MIG: [device]}, pod_id=f"mig-{cycle}"), pool.admission_failures
                pool.release(0, f"mig-{cycle}")
                assert pool.reshape(0, 0, None)
    finally:
        pool.close()
    assert pool.admitted == 6 and pool.admission_failures == []


def test_every_extender_call_finds_what_each_agent_publishes_in_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extender decides from the request and its cache only, so its cache must hold, at every
    call, the object each agent publishes at that moment: an agent's thread that changed it
    without the loop having waited for the change would make the answer depend on when the
    change came (its delivery at this tick or the next). The short run of the test above, with
    its faults and the latent faults' active checks, observed at each verb."""
    pools: list[NodeAgentPool] = []
    delivered: dict[int, dict[str, Any]] = {}
    behind: list[str] = []
    calls: list[str] = []
    start_pool, receive, post = NodeAgentPool.__init__, ExtenderPlacer.receive_inventory, ExtenderPlacer._post

    def started(pool: NodeAgentPool, *args: Any, **kwargs: Any) -> None:
        start_pool(pool, *args, **kwargs)
        pools.append(pool)

    def received(placer: ExtenderPlacer, node: int, obj: Mapping[str, Any]) -> None:
        delivered[node] = copy.deepcopy(dict(obj))
        receive(placer, node, obj)

    def posted(placer: ExtenderPlacer, verb: str, body: Mapping[str, Any]) -> Any:
        calls.append(verb)
        for node in [n for n in range(64) if pools and pools[-1].has(n)]:
            if pools[-1].published(node) != delivered.get(node):
                behind.append(f"t={placer.now_s:.0f} /{verb}: node {node}")
        return post(placer, verb, body)

    monkeypatch.setattr(NodeAgentPool, "__init__", started)
    monkeypatch.setattr(ExtenderPlacer, "receive_inventory", received)
    monkeypatch.setattr(ExtenderPlacer, "_post", posted)
    options = SimulateOptions(
        nodes=4,
        profiles=None,
        trace=None,
        policy="gpuweave",
        seed=7,
        duration_s=3600.0,
        load=0.95,
        out=tmp_path / "out",
        compare=False,
        progress=False,
    )
    assert run_simulation(options) == 0
    assert {"filter", "prioritize", "bind"} <= set(calls)
    assert behind == []
