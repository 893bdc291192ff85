"""`gpuweave check`: run an active check of a node's GPUs now, through its running node agent.

The request goes over the agent's control socket (``STATE_DIR/agent.sock``): ``health.check``
starts the run (the agent exercises the GPUs nothing holds, withholding them meanwhile), then this
command asks ``health.check.run`` for its outcome every half second, printing a progress line
every few seconds, until the run is done. A failed GPU is withheld by the agent's health as any
fault is (docs/health.md, Active checks); an NVLink pair below threshold fails neither GPU and is
published as a degraded link. Exit 0 when every GPU checked passed and no link was slow, 1
otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from nodeagent.control import call_agent

POLL_S = 0.5
PROGRESS_EVERY_S = 5.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check",
        help="run an active check (memory, compute, PCIe and NVLink bandwidth) of a node's GPUs now",
        description=(
            "Exercise the GPUs of a running node agent now: a memory pattern, a compute kernel with a "
            "known answer, host<->device and NVLink copies, judged against the GPU model (or DCGM's "
            "diagnostic where DCGM runs). GPUs a pod holds are skipped; the others are withheld "
            "while they run. A GPU that fails is withheld until a check passes again."
        ),
    )
    add = parser.add_argument
    add("--state-dir", type=Path, required=True, help="the agent's --state-dir (holds agent.sock)")
    add("--gpu", type=int, action="append", metavar="INDEX", help="check this GPU (repeatable; default all)")
    add("--level", type=int, choices=(1, 2, 3, 4), help="1 quick .. 4 extended (default: the burn-in level)")
    add("--run", type=int, metavar="ID", help="show run ID's outcome instead of starting one")
    add("--json", action="store_true", help="print the outcome as JSON")
    add("--timeout", type=float, default=7200.0, help="seconds to wait for the run to end (default 7200)")
    parser.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    if args.run is not None:
        outcome = call_agent(args.state_dir, "health.check.run", {"run": args.run}, timeout=10)
    else:
        params = {"gpus": args.gpu, "level": args.level}
        started = call_agent(args.state_dir, "health.check", params, timeout=10)
        if not args.json:
            print(
                f"active check {started['run']} started (level {started['level']}, {started['backend']})",
                flush=True,
            )
        outcome = wait_for(args.state_dir, int(started["run"]), timeout_s=args.timeout, quiet=args.json)
    print(json.dumps(outcome, indent=2) if args.json else outcome_text(outcome))
    return (
        0
        if outcome["state"] == "done"
        and all(g["verdict"] in ("passed", "skipped") for g in outcome["gpus"].values())
        and not outcome.get("slowLinks")
        else 1
    )


def wait_for(state_dir: Path, run: int, *, timeout_s: float, quiet: bool) -> dict[str, Any]:
    """Poll the run until it is no longer running; a progress line every few seconds."""
    started = last = time.monotonic()
    while True:
        outcome = call_agent(state_dir, "health.check.run", {"run": run}, timeout=10)
        if outcome["state"] != "running":
            return outcome
        now = time.monotonic()
        if now - started > timeout_s:
            raise GpuweaveError(
                f"active check {run} still running after {timeout_s:g} s; "
                f"read it later with gpuweave check --state-dir {state_dir} --run {run}"
            )
        if not quiet and now - last >= PROGRESS_EVERY_S:
            print(f"  still running ({now - started:.0f} s)", file=sys.stderr, flush=True)
            last = now
        time.sleep(POLL_S)


def outcome_text(outcome: dict[str, Any]) -> str:
    head = (
        f"active check {outcome['run']}: {outcome['trigger']}, level {outcome['level']}, "
        f"{outcome['backend']}, {outcome['state']} in {outcome['seconds']:.1f} s"
    )
    lines = [head] + ([f"  error: {outcome['error']}"] if outcome.get("error") else [])
    lines.append(f"{'GPU':>3}  {'verdict':<10}  {'UUID':<40}  reason")
    for uuid, gpu in outcome["gpus"].items():
        reasons = gpu["reasons"] or [""]
        lines.append(f"{gpu['index']:>3}  {gpu['verdict']:<10}  {uuid:<40}  {reasons[0]}")
        lines.extend(f"{'':>3}  {'':<10}  {'':<40}  {reason}" for reason in reasons[1:])
    slow = outcome.get("slowLinks", [])
    lines.extend(f"degraded link (both GPUs stay in service): {text}" for text in slow)
    measured = [r for r in outcome.get("results", []) if r.get("gbps") is not None or r.get("seconds")]
    if measured:
        lines.append(f"{'check':<7}  {'GPU':<12}  {'peer':<12}  {'status':<8}  {'seconds':>8}  {'GB/s':>7}")
    for r in measured:
        gbps = f"{r['gbps']:.1f}" if r.get("gbps") is not None else "-"
        lines.append(
            f"{r['check']:<7}  {r['gpu'][:12]:<12}  {(r.get('peer') or '')[:12]:<12}  {r['status']:<8}  "
            f"{r['seconds']:>8.3f}  {gbps:>7}"
        )
    return "\n".join(lines)
