"""`gpuweave exercise`: an active check of the GPUs this process can see, in this process's container.

Where ``gpuweave check`` asks a node agent to exercise its node's idle GPUs, this runs the same
check (the agent's runner, exerciser and judgement: ``health.active_runner``) on the GPUs the
container it runs in was given: those ``NVIDIA_VISIBLE_DEVICES`` names (what a device plugin's
Allocate or a DRA claim sets; ``--gpu UUID`` to choose), each only once its device node
(``/dev/nvidia<minor>``, from the CDI spec the runtime applied) is there; a GPU named but without
its device node fails closed. It needs no control socket, no host path and no privilege: a gang
preflight pod, or any pod that wants its GPUs proved before work lands, runs it with its own
devices (docs/health.md, Gang preflight). ``--simulate PROFILE`` uses the simulated exerciser.
Exit 0 when every GPU passed, 1 otherwise, 2 for a bad request.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import Gpu, NodeInventory
from gpuweave.commands.check import outcome_text
from hardware.exerciser.protocol import BANDWIDTH_CHECKS, GPU_CHECKS
from health.active_book import GpuOutcome, RunOutcome

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
NOT_A_LIST = ("", "all", "none", "void")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "exercise",
        help="run an active check of the GPUs this container was given (no node agent needed)",
        description=(
            "Exercise the GPUs this process can see (NVIDIA_VISIBLE_DEVICES, or --gpu): memory "
            "pattern, compute kernel, host<->device and NVLink copies (or the copies only, "
            "--checks bandwidth), judged as the node agent judges them. A GPU whose device node is "
            "missing fails closed."
        ),
    )
    add = parser.add_argument
    add("--simulate", metavar="PROFILE", help="a simulated node of this profile (built-in name or file)")
    add(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="the node (a simulated GPU's UUID derives from it)",
    )
    add(
        "--gpu",
        action="append",
        metavar="UUID",
        help="check this GPU (repeatable; default: the visible ones)",
    )
    add("--level", type=int, choices=(1, 2, 3, 4), default=1, help="1 quick .. 4 extended (default 1)")
    add("--checks", choices=("all", "bandwidth"), default="all", help="bandwidth: the copies only")
    add("--dev-root", type=Path, default=Path("/"), help="where /dev is (default /)")
    add("--json", action="store_true", help="print the outcome as JSON")
    parser.set_defaults(handler=run_exercise)


def run_exercise(args: argparse.Namespace) -> int:
    from gpuweave.node.builder import open_backend  # noqa: PLC0415 (the hardware stack on demand)

    with tempfile.TemporaryDirectory(prefix="gpuweave-exercise-") as scratch:
        backend = open_backend(args.simulate, node_name=args.node_name or "node", state_dir=Path(scratch))
        try:
            inventory = backend.discover()
            chosen, missing = _chosen(inventory, args)
            outcome = _run(backend, inventory, chosen, args, Path(scratch)) if chosen else None
        finally:
            backend.close()
    result = _with_missing(outcome, missing, inventory)
    print(json.dumps(result.to_json(), indent=2) if args.json else outcome_text(result.to_json()))
    verdicts = {g.verdict for g in result.gpus.values()}
    return 0 if result.state == "done" and verdicts == {"passed"} else 1


def _chosen(inventory: NodeInventory, args: argparse.Namespace) -> tuple[list[Gpu], dict[str, str]]:
    """The GPUs to check, and those named without their device node here (UUID -> why)."""
    by_uuid = {g.uuid.lower(): g for g in inventory.gpus}
    visible = os.environ.get(VISIBLE, "")
    named = args.gpu or ([] if visible.strip().lower() in NOT_A_LIST else visible.split(","))
    if not named:
        wanted = list(inventory.gpus)
    else:
        unknown = [u for u in named if u.strip().lower() not in by_uuid]
        if unknown:
            raise InvalidInputError(
                f"GPU {unknown[0].strip()[:80]} is not on this node; it has {len(by_uuid)} GPUs"
            )
        wanted = [by_uuid[u.strip().lower()] for u in named]
    chosen, missing = [], {}
    for gpu in wanted:
        node = args.dev_root / gpu.device_node.lstrip("/")
        if node.exists():
            chosen.append(gpu)
        else:
            missing[gpu.uuid] = f"its device node {gpu.device_node} is not in this container"
    return chosen, missing


def _run(
    backend: Any, inventory: NodeInventory, gpus: list[Gpu], args: argparse.Namespace, scratch: Path
) -> RunOutcome:
    """One run of the agent's own runner over ``gpus`` (nothing held: this container owns them)."""
    from gpuweave.node.active import exerciser_for  # noqa: PLC0415
    from gpuweave.node.health import probe_for  # noqa: PLC0415
    from health.config import ActiveSettings, HealthSettings, IdleSettings  # noqa: PLC0415
    from health.service import HealthParts, HealthService  # noqa: PLC0415

    probe = probe_for(backend)
    settings = HealthSettings(active=ActiveSettings(idle=IdleSettings(interval_s=0)))  # one run, no schedule
    service = HealthService(
        HealthParts(
            inventory=inventory,
            probe=probe,
            device_ops=probe,
            sink=_Sink(),
            state_dir=scratch / "state",
            settings=settings,
            node_name=args.node_name or inventory.name,
            exerciser=exerciser_for(backend, settings.active),
        )
    )
    assert service.active is not None
    checks = BANDWIDTH_CHECKS if args.checks == "bandwidth" else GPU_CHECKS
    return service.active.run([g.index for g in gpus], level=args.level, trigger="container", checks=checks)


class _Sink:
    """Health verdicts go nowhere but the printed outcome: no agent serves these GPUs from here."""

    def set_device_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        return None


def _with_missing(
    outcome: RunOutcome | None, missing: dict[str, str], inventory: NodeInventory
) -> RunOutcome:
    base = outcome or RunOutcome(0, "container", 1, "none", state="done")
    index = {g.uuid: g.index for g in inventory.gpus}
    gpus = dict(base.gpus) | {u: GpuOutcome(index[u], "failed", (why,)) for u, why in missing.items()}
    return replace(base, gpus=gpus)
