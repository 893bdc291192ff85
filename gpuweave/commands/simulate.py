"""`gpuweave simulate`: run a simulated GPU cluster with the real components and report (the main job)"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devicemodel.errors import InvalidInputError
from gpuweave.simulate import DEFAULT_BOOT_S, DEFAULT_MAX_NEW_NODES, FULL_AGENTS_UP_TO, SAMPLED_AGENTS

DEFAULT_OUT = Path("out/simulate")


def _seconds(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m`` or ``6h``."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}; use e.g. 6h, 90m or 3600") from None
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"bad duration {text!r}; use e.g. 6h, 90m or 3600")
    return seconds


def _duration(text: str) -> float:
    """The simulated time: at least a minute."""
    seconds = _seconds(text)
    if seconds < 60:
        raise argparse.ArgumentTypeError(f"duration {text!r} is under one simulated minute; use e.g. 1h")
    return seconds


def _boot_time(text: str) -> float:
    """A machine's boot: from nothing (0) to a simulated day."""
    seconds = _seconds(text)
    if not 0 <= seconds <= 86_400:
        raise argparse.ArgumentTypeError(f"node boot time {text!r}: give 0 to 24h, e.g. 5m")
    return seconds


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="run a simulated GPU cluster with the real components and report (the main job)",
        description=(
            "Simulate a mixed GPU cluster under a workload of training gangs, single-GPU jobs and "
            "fractional inference, with faults injected mid-run and a shift to MIG demand, broken "
            "nodes replaced and pending demand scaled up by the node lifecycle; compare placement "
            "policies on the same workload; print a summary and write JSON + PNG."
        ),
    )
    parser.add_argument("--nodes", type=int, default=16, help="number of nodes (default 16)")
    parser.add_argument(
        "--profiles",
        default=None,
        help="comma list of node or rack profiles (built-in names or YAML paths), used round-robin "
        "(default p5.48xlarge,p4d.24xlarge,dgx-a100,l40s-pcie-8)",
    )
    parser.add_argument("--trace", type=Path, default=None, help="pod list in Alibaba 2023 CSV format")
    parser.add_argument(
        "--policy",
        default="gpuweave",
        help="policy of the main run: gpuweave, random, best-fit, go-gpuallocator-like (default gpuweave)",
    )
    parser.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    parser.add_argument(
        "--duration", type=_duration, default=_duration("6h"), help="simulated time (default 6h)"
    )
    parser.add_argument("--load", type=float, default=0.95, help="offered GPU load, fraction of capacity")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"report folder (default {DEFAULT_OUT})"
    )
    parser.add_argument("--no-compare", action="store_true", help="run only --policy, not the other policies")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run gpuweave's scoring in-process instead of the real extender over HTTP",
    )
    parser.add_argument(
        "--no-agents", action="store_true", help="do not start the node agents (device plugins over gRPC)"
    )
    parser.add_argument(
        "--no-latent",
        action="store_true",
        help=(
            "inject no latent faults (bad memory, slow NVLink: only active checks find them) and run "
            "no checks between jobs or gang preflights"
        ),
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=None,
        metavar="N",
        help=f"run node agents on N nodes spread over the cluster, the rest without (default: every "
        f"node up to {FULL_AGENTS_UP_TO} nodes, else {SAMPLED_AGENTS}); --no-agents: none",
    )
    parser.add_argument(
        "--nodes-per-block",
        type=int,
        default=2,
        help="nodes of one profile per layer-3 network block (EKS network-node-layer-3 label; default 2)",
    )
    parser.add_argument(
        "--node-boot-time",
        type=_boot_time,
        default=DEFAULT_BOOT_S,
        metavar="DURATION",
        help="from a machine's launch (a replacement or a scale-up) until its node is ready "
        "(default 5m: a p5 through Karpenter)",
    )
    parser.add_argument(
        "--max-new-nodes",
        type=int,
        default=DEFAULT_MAX_NEW_NODES,
        metavar="N",
        help=f"most machines a scale-up has added at once (default {DEFAULT_MAX_NEW_NODES}; 0: no scale-up)",
    )
    parser.add_argument(
        "--no-lifecycle",
        action="store_true",
        help="a fixed fleet: no node replacement, no scale-up (the run before the lifecycle)",
    )
    parser.set_defaults(handler=run)


def check_out_dir(out: Path) -> None:
    """Create ``--out`` and write a file there now, so a bad one is one line before the run, not
    a traceback after it."""
    probe = out / f".gpuweave-simulate-probe.{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InvalidInputError(
            f"--out {out}: cannot write the report there ({exc.strerror or exc}); "
            "give a directory you can write"
        ) from None


@contextlib.contextmanager
def quiet_agent_health() -> Iterator[None]:
    """The simulated agents' health transitions are the report's fault lines; at the default
    level (WARNING) their log lines would only break into the progress bars. ``--log-level INFO``
    (or DEBUG) keeps them. The logger's level is restored after the run."""
    health = logging.getLogger("health.monitor")
    before = health.level
    if logging.getLogger().getEffectiveLevel() >= logging.WARNING:
        health.setLevel(logging.ERROR)
    try:
        yield
    finally:
        health.setLevel(before)


def run(args: argparse.Namespace) -> int:
    from gpuweave.simulate.runner import SimulateOptions, run_simulation  # noqa: PLC0415 (numpy/matplotlib on demand)

    if args.agents is not None and args.agents < 1:
        raise InvalidInputError(f"--agents {args.agents}: give at least 1 node (or --no-agents for none)")
    if args.load <= 0 or args.load > 3:
        raise InvalidInputError(f"--load {args.load}: give a fraction of capacity between 0 and 3")
    check_out_dir(args.out)
    options = SimulateOptions(
        nodes=args.nodes,
        profiles=args.profiles,
        trace=args.trace,
        policy=args.policy,
        seed=args.seed,
        duration_s=args.duration,
        load=args.load,
        out=args.out,
        compare=not args.no_compare,
        progress=not args.no_progress,
        in_process=args.in_process,
        agents=not args.no_agents,
        latent=not args.no_latent,
        agent_nodes=args.agents,
        nodes_per_block=args.nodes_per_block,
        lifecycle=not args.no_lifecycle,
        node_boot_s=args.node_boot_time,
        max_new_nodes=args.max_new_nodes,
    )
    with quiet_agent_health():
        return run_simulation(options)
