"""Composition root of ``gpuweave simulate``: build the cluster and workload, run, report."""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from devicemodel.errors import InvalidInputError
from devicemodel.gangs import ANNOTATION_GANG_TIER
from gpuweave.simulate import DEFAULT_BOOT_S, DEFAULT_MAX_NEW_NODES, FULL_AGENTS_UP_TO, SAMPLED_AGENTS
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.engine import RunResult, Simulation
from gpuweave.simulate.faults import faults_for
from gpuweave.simulate.fleet import (
    DEFAULT_NODES_PER_BLOCK,
    FleetNode,
    build_fleet,
    clique_members,
    clique_name,
    nvlink_pool_gpus,
    parse_profiles,
    reserve_rows,
    share_pool,
)
from gpuweave.simulate.latent import LatentFaults
from gpuweave.simulate.lifecycle import LifecycleSettings, NodeLifecycle
from gpuweave.simulate.lifecycle_report import paid_line, replacement_line, scale_up_line
from gpuweave.simulate.outcomes import GangRecovery
from gpuweave.simulate.placers import SIMULATE_POLICIES, Placer, make_placer
from gpuweave.simulate.report import (
    add_common_completion,
    fault_table,
    plot_summary,
    plot_timeline,
    summarize,
    summary_table,
    write_json,
)
from gpuweave.simulate.workload import (
    GANG_TIER_CLIQUE,
    Job,
    JobKind,
    WorkloadSettings,
    synthetic_jobs,
    trace_jobs,
)
from topology.fragmentation import FragmentModel, TaskShape, typical_workload, with_memory

TICK_S = 60.0
MAX_NEW_NODES_LIMIT = 1000  # each is a row of the cluster's arrays from the start
GANG_TIER_ANNOTATION = f"{ANNOTATION_GANG_TIER}: {GANG_TIER_CLIQUE}"


@dataclass(frozen=True)
class SimulateOptions:
    nodes: int
    profiles: str | None
    trace: Path | None
    policy: str
    seed: int
    duration_s: float
    load: float
    out: Path
    compare: bool = True
    progress: bool = True
    in_process: bool = False  # gpuweave's extender called in-process instead of over HTTP
    agents: bool = True  # start the real node agents (device plugins + simulated kubelets)
    agent_nodes: int | None = None  # how many nodes run one (None: ``agent_sample``'s default)
    nodes_per_block: int = DEFAULT_NODES_PER_BLOCK  # nodes of one profile per layer-3 network block
    latent: bool = True  # inject latent faults; with agents, the active checks that look for them
    lifecycle: bool = True  # broken nodes replaced, pending demand scaled up (``lifecycle``)
    node_boot_s: float = DEFAULT_BOOT_S  # a launched machine until its node is ready
    max_new_nodes: int = DEFAULT_MAX_NEW_NODES  # machines a scale-up may have added at once


def _models(fleet: tuple[FleetNode, ...], jobs: list[Job]) -> tuple[FragmentModel, FragmentModel]:
    """The fragmentation measure for this workload (reported) and gpuweave's memory-aware one."""
    pods = [j for j in jobs if j.kind is not JobKind.MIG]
    shapes = [TaskShape(j.cpu_milli, j.gpu_milli, j.gpus_per_pod) for j in pods]
    workload = typical_workload(shapes, coverage=1.0)
    aware = with_memory(workload, [(s, j.memory_mib) for s, j in zip(shapes, pods, strict=True)])
    kinds = sorted({n.profile for n in fleet})
    max_gpus = max(n.gpus for n in fleet)
    return FragmentModel(workload, models=kinds, max_gpus=max_gpus), FragmentModel(
        aware, models=kinds, max_gpus=max_gpus
    )


def workload_settings(fleet: tuple[FleetNode, ...], *, duration_s: float, load: float) -> WorkloadSettings:
    """The workload shaped to the fleet (``workload`` module doc): gang pods as large as its largest
    node, MIG requests only where a node is MIG-managed, NVL72 gang sizes on an NVLink pool."""
    return WorkloadSettings(
        duration_s=duration_s,
        capacity_gpus=sum(n.gpus for n in fleet),
        load=load,
        node_gpus=max(n.gpus for n in fleet),
        mig=any(n.mig_managed for n in fleet),
        clique_gpus=nvlink_pool_gpus(fleet, share_pool(fleet)),
    )


def _jobs(options: SimulateOptions, fleet: tuple[FleetNode, ...]) -> list[Job]:
    settings = workload_settings(fleet, duration_s=options.duration_s, load=options.load)
    if options.trace is not None:
        return trace_jobs(options.trace, settings, seed=options.seed)
    return synthetic_jobs(settings, seed=options.seed)


@dataclass(frozen=True)
class Cluster:
    """The fleet of a run: its machines, then the rows kept for machines a scale-up adds."""

    fleet: tuple[FleetNode, ...]
    machines: int  # the first ``machines`` rows hold the fleet's machines at the start

    @property
    def base(self) -> tuple[FleetNode, ...]:
        return self.fleet[: self.machines]

    @property
    def reserve(self) -> tuple[int, ...]:
        return tuple(range(self.machines, len(self.fleet)))

    @property
    def share_nodes(self) -> frozenset[int]:
        return share_pool(self.base)


def _placer(policy: str, *, cluster: Cluster, options: SimulateOptions) -> Placer:
    """gpuweave is always the real extender (over HTTP, or its service objects called in-process
    with --in-process), learning the workload from the pods it sees; baselines are in-process."""
    if policy == "gpuweave":
        from gpuweave.simulate.extender_client import ExtenderPlacer  # noqa: PLC0415 (HTTP server on demand)

        transport = "in-process" if options.in_process else "http"
        return ExtenderPlacer(
            cluster.fleet, share_nodes=cluster.share_nodes, transport=transport, absent=cluster.reserve
        )
    return make_placer(policy, node_count=len(cluster.fleet), seed=options.seed)


def _lifecycle(cluster: Cluster, options: SimulateOptions) -> NodeLifecycle | None:
    if not options.lifecycle:
        return None
    settings = LifecycleSettings(boot_s=options.node_boot_s, max_new_nodes=options.max_new_nodes)
    return NodeLifecycle(
        cluster.fleet, reserve=cluster.reserve, share_nodes=cluster.share_nodes, settings=settings
    )


def _run_one(
    policy: str,
    *,
    cluster: Cluster,
    jobs: list[Job],
    models: tuple[FragmentModel, FragmentModel],
    options: SimulateOptions,
) -> RunResult:
    fleet = cluster.fleet
    placer = _placer(policy, cluster=cluster, options=options)
    agents = _agents(cluster, options) if policy == "gpuweave" and options.agents else None
    try:
        simulation = Simulation(
            fleet=fleet,
            jobs=jobs,
            placer=placer,
            metric_model=models[0],
            duration_s=options.duration_s,
            tick_s=TICK_S,
            seed=options.seed,
            agents=agents,
            faults=faults_for(cluster.base),
            share_nodes=cluster.share_nodes,
            lifecycle=_lifecycle(cluster, options),
            latent=(
                LatentFaults(fleet, duration_s=options.duration_s, seed=options.seed, agents=agents)
                if options.latent
                else None
            ),
        )
        ticks = int(options.duration_s // TICK_S) + 1
        label = f"{policy} ({placer.transport})"
        with tqdm(
            total=ticks, desc=f"{label:<34}", unit="tick", disable=not options.progress, ncols=100
        ) as bar:
            return simulation.run(on_tick=bar.update, on_drain=DrainProgress(bar, label))
    finally:
        placer.close()
        if agents is not None:
            agents.close()


class DrainProgress:
    """The drain on the progress bar: once the arrival window's ticks are done, the same bar
    counts the jobs that finished out of those still queued or running when the drain began."""

    def __init__(self, bar: tqdm[Any], label: str) -> None:
        self._bar = bar
        self._label = label
        self._total = 0

    def __call__(self, left: int) -> None:
        if not self._total:
            self._total = left
            self._bar.reset(total=left)
            self._bar.unit = "job"
            self._bar.set_description(f"{self._label + ' drain':<34}", refresh=False)
        self._bar.n = self._total - left
        self._bar.refresh()


def agent_sample(nodes: int, wanted: int | None) -> list[int] | None:
    """The nodes that run an agent: every node (None) up to ``FULL_AGENTS_UP_TO`` nodes, else
    ``SAMPLED_AGENTS``, or ``wanted``; a sample is spread evenly over the fleet (whose profiles are
    interleaved round-robin, so every profile is in it). Each agent holds a simulated kubelet, a
    health monitor and gRPC servers (about 20 threads), which is what a 1,000-node run cannot
    afford for every node on 2 cores."""
    count = wanted if wanted is not None else nodes if nodes <= FULL_AGENTS_UP_TO else SAMPLED_AGENTS
    if count >= nodes:
        return None
    return sorted({round(i * nodes / count) for i in range(count)})


def _agents(cluster: Cluster, options: SimulateOptions) -> NodeAgentPool:
    started = time.perf_counter()
    only = agent_sample(cluster.machines, options.agent_nodes)
    pool = NodeAgentPool(cluster.fleet, share_nodes=cluster.share_nodes, only=only, absent=cluster.reserve)
    if options.progress:
        elapsed = time.perf_counter() - started
        sample = f" (a sample of the {cluster.machines} nodes)" if only is not None else ""
        print(f"started {len(pool)} node agents (device plugins over gRPC){sample} in {elapsed:.1f} s")
    return pool


def run_simulation(options: SimulateOptions) -> int:
    # the agents' active-check runs log each finding; the report's latent-fault rows count them
    logging.getLogger("health.active_runner").setLevel(logging.ERROR)
    logging.getLogger("health.active_claims").setLevel(logging.ERROR)
    logging.getLogger("health.links").setLevel(logging.ERROR)  # a slow NVLink pair found: the same rows
    # a reset that fails (an Xid 79's GPU stays off the bus) is the report's replacement line
    logging.getLogger("health.remediation").setLevel(logging.ERROR)
    logging.getLogger("hardware.health_probe").setLevel(logging.ERROR)
    if options.policy not in SIMULATE_POLICIES:
        raise InvalidInputError(
            f"unknown --policy {options.policy!r}; choose from {', '.join(SIMULATE_POLICIES)}"
        )
    started = time.perf_counter()
    fleet = build_fleet(
        parse_profiles(options.profiles), nodes=options.nodes, nodes_per_block=options.nodes_per_block
    )
    if not 0 <= options.max_new_nodes <= MAX_NEW_NODES_LIMIT:
        raise InvalidInputError(
            f"--max-new-nodes {options.max_new_nodes}: give 0 to {MAX_NEW_NODES_LIMIT} machines"
        )
    reserve = reserve_rows(fleet, options.max_new_nodes) if options.lifecycle else ()
    cluster = Cluster(fleet + reserve, len(fleet))
    jobs = _jobs(options, fleet)
    models = _models(fleet, jobs)
    _print_setup(fleet, jobs, options)
    policies = [options.policy] + (
        [p for p in SIMULATE_POLICIES if p != options.policy] if options.compare else []
    )
    results = [_run_one(p, cluster=cluster, jobs=jobs, models=models, options=options) for p in policies]
    summaries = [summarize(r) for r in results]
    add_common_completion(results, summaries)
    print()
    print(summary_table(summaries))
    print()
    print(fault_table(summaries[0]))
    print(f"MIG reshapes ({options.policy} run): {_reshape_line(results[0])}")
    print(f"gang recovery ({options.policy} run): {_recovery_line(results[0])}")
    if results[0].cliques:
        print(f"NVLink cliques ({options.policy} run): {_clique_line(summaries[0])}")
    print(f"node replacement ({options.policy} run): {replacement_line(summaries[0])}")
    print(f"scale-up ({options.policy} run): {scale_up_line(summaries[0])}")
    print(f"GPU-hours ({options.policy} run): {paid_line(summaries[0])}")
    _write_outputs(options, results, summaries, fleet, elapsed=time.perf_counter() - started)
    return 0


def _reshape_line(result: RunResult) -> str:
    if not result.reshapes:
        return "none"
    first = result.reshapes[0]
    return (
        f"{len(result.reshapes)} (first at t={first.at_s / 60:.0f} min on {first.node} GPU {first.gpu}: "
        f"created {', '.join(first.created) or '-'}; destroyed {', '.join(first.destroyed) or '-'})"
    )


def _recovery_line(result: RunResult) -> str:
    recoveries = result.ledger.recoveries
    if not recoveries:
        return "no training job was evicted by a fault"
    parts = [
        f"{r.job_id} ({r.pods} pod(s), {r.fault.split(' ')[0]} at t={r.fault_at_s / 60:.0f} min): "
        + (_recovery_parts(r) if r.seconds is not None else "not running again by the end")
        for r in recoveries
    ]
    return "; ".join(parts)


def _recovery_parts(recovery: GangRecovery) -> str:
    """``35 s = detection 5 s + waiting 0 s + preemption grace 30 s``; on a fleet of cliques, and
    where it ran before and after (``in A, again in B``)."""
    parts = recovery.parts or {}
    named = " + ".join(f"{name.replace('_', ' ')} {seconds:.0f} s" for name, seconds in parts.items())
    where = ""
    if recovery.cliques:
        before = " + ".join(recovery.cliques_before) or "?"
        where = f"; ran in {before}, again in {' + '.join(recovery.cliques)}"
    return f"{recovery.seconds:.0f} s = {named}{where}"


def _clique_line(summary: dict[str, Any]) -> str:
    """Multi-node gang starts inside one clique / across, per clique, and their wait by size."""
    per = ", ".join(f"{name} {count}" for name, count in summary["multi_node_gangs_per_clique"].items())
    starts = summary["multi_node_gang_starts_by_gpus"]
    waits = ", ".join(
        f"{gpus} GPUs {minutes:.1f} over {starts[gpus]}"
        for gpus, minutes in summary["multi_node_gang_wait_by_gpus_mean_min"].items()
    )
    wait = summary["multi_node_gang_wait_mean_min"]
    recovered = f"{summary['gangs_recovered_in_one_clique']} of {summary['gangs_recovered']}"
    return (
        f"multi-node gang starts inside one clique {summary['multi_node_gangs_in_one_clique']}, "
        f"across cliques {summary['multi_node_gangs_across_cliques']} ({per}); their wait, mean "
        f"{'-' if wait is None else f'{wait:.1f}'} min ({waits or '-'}); gangs evicted by a fault and "
        f"re-placed inside one clique: {recovered}"
    )


def _print_setup(fleet: tuple[FleetNode, ...], jobs: list[Job], options: SimulateOptions) -> None:
    kinds: dict[str, int] = {}
    for node in fleet:
        kinds[node.profile] = kinds.get(node.profile, 0) + 1
    mix: dict[str, int] = {}
    for job in jobs:
        mix[job.kind.value] = mix.get(job.kind.value, 0) + 1
    cliques = clique_members(fleet)
    shift = "MIG demand shift at half time" if any(n.mig_managed for n in fleet) else "no MIG-managed node"
    print(
        f"cluster: {len(fleet)} nodes, {sum(n.gpus for n in fleet)} GPUs "
        f"({', '.join(f'{c}x {k}' for k, c in kinds.items())})\n"
        f"workload: {len(jobs)} jobs over {options.duration_s / 3600:.1f} h simulated "
        f"({', '.join(f'{c} {k}' for k, c in mix.items())}); "
        f"{'pods from ' + options.trace.name if options.trace else shift}; "
        f"faults: Xid 79, ECC double-bit, EFA link loss" + (", NVLink tray fault" if cliques else "")
    )
    if cliques:
        pool = share_pool(fleet)
        named = ", ".join(
            f"{clique_name(fleet[m[0]])} ({len(m)} nodes{', inference pool' if set(m) <= pool else ''})"
            for m in cliques.values()
        )
        sizes = sorted({j.pods * j.gpus_per_pod for j in jobs if j.kind is JobKind.GANG and j.pods > 1})
        print(
            f"NVLink cliques: {named}; multi-node gangs of {', '.join(map(str, sizes)) or '-'} GPUs"
            + (f" ask for one clique ({GANG_TIER_ANNOTATION})" if any(j.gang_tier for j in jobs) else "")
        )


def _without_cliques(record: dict[str, Any], result: RunResult) -> dict[str, Any]:
    """A placement's or recovery's record; its clique fields only on a fleet of cliques."""
    if result.cliques:
        return record
    return {k: v for k, v in record.items() if k not in ("cliques", "cliques_before")}


def _write_outputs(
    options: SimulateOptions,
    results: list[RunResult],
    summaries: list[dict[str, Any]],
    fleet: tuple[FleetNode, ...],
    *,
    elapsed: float,
) -> None:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "cluster": [
            {
                "name": n.name,
                "profile": n.profile,
                "gpus": n.gpus,
                "mig_managed": n.mig_managed,
                "labels": dict(n.labels),
            }
            for n in fleet
        ],
        "summaries": summaries,
        "timelines": {r.policy: [asdict(s) for s in r.samples] for r in results},
        "mig_reshapes": [asdict(r) for r in results[0].reshapes],
        "topology_outcomes": [asdict(o) for o in results[0].topology],
        "training_placements": {
            r.policy: [_without_cliques(asdict(p), r) for p in r.ledger.training] for r in results
        },
        "gang_recoveries": {
            r.policy: [
                _without_cliques({**asdict(g), "seconds": g.seconds, "parts": g.parts}, r)
                for g in r.ledger.recoveries
            ]
            for r in results
        },
        "elapsed_s": elapsed,
        "peak_rss_mib": peak_rss_mib(),
    }
    write_json(out / "report.json", payload)
    timeline = plot_timeline(results, results[0], out / "timeline.png")
    summary = plot_summary(summaries, out / "policies.png")
    print(
        f"\nwrote {out / 'report.json'}, {timeline}, {summary}  "
        f"({elapsed:.0f} s, peak memory {payload['peak_rss_mib']:.0f} MiB)"
    )


def peak_rss_mib() -> float:
    """The largest resident set this process has had (the extender, the agents and the loop all
    run in it), or that of its largest finished child process if larger, in MiB (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024
