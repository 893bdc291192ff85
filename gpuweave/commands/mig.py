"""`gpuweave mig`: plan or apply MIG layouts, one GPU at a time.

``plan`` is a dry run against a node profile (its GPUs and declared MIG devices): it prints every
instance kept, destroyed and created with its placement (start slot and size), or the one-line
reason the target is impossible. ``apply`` asks the running node agent that owns ``--state-dir``
to reshape a GPU through its control socket, waits, and prints what changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.inventory import NodeInventory
from hardware.mig_catalog import GpuModel, default_catalog
from hardware.profiles import load_profile
from mig.intent import parse_entry, parse_profile_list
from mig.planner import Instance, Plan, plan_demand, plan_layout
from nodeagent.control import call_agent

APPLY_TIMEOUT_S = 600.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "mig",
        help="plan or apply MIG layouts",
        description="Plan a MIG layout for one GPU (dry run) or apply it through the running node agent.",
    )
    verbs = parser.add_subparsers(dest="mig_command", metavar="VERB", required=True)
    plan = verbs.add_parser("plan", help="print the placement plan for one GPU, or why it is impossible")
    plan.add_argument("--simulate", metavar="PROFILE|FILE", required=True, help="node profile to plan on")
    plan.add_argument("--gpu", type=int, required=True, help="GPU index")
    target = plan.add_mutually_exclusive_group(required=True)
    target.add_argument("--profiles", help="target layout, e.g. 3g.40gb,3g.40gb or 1g.10gb@6 (pinned start)")
    target.add_argument("--demand", help="pending requests, e.g. 1g.10gb=3,3g.40gb=1")
    plan.add_argument(
        "--current",
        help="instances to start from instead of the profile's, e.g. 3g.40gb@0:busy,1g.10gb@6",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(handler=run_plan)

    apply = verbs.add_parser("apply", help="reshape one GPU through the running node agent")
    apply.add_argument("--state-dir", type=Path, required=True, help="the node agent's state directory")
    apply.add_argument("--gpu", type=int, required=True, help="GPU index")
    layout = apply.add_mutually_exclusive_group(required=True)
    layout.add_argument("--profiles", help="target layout, e.g. 3g.40gb,3g.40gb ('' = MIG on, no instances)")
    layout.add_argument("--whole", action="store_true", help="turn MIG off: the GPU is one device again")
    apply.add_argument("--timeout", type=float, default=APPLY_TIMEOUT_S, help="seconds to wait for the agent")
    apply.set_defaults(handler=run_apply)


# -- plan ----------------------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> int:
    inventory = load_profile(args.simulate).to_inventory()
    gpu = _gpu(inventory, args.gpu)
    if not gpu.mig_capable:
        raise GpuweaveError(f"GPU {args.gpu} ({gpu.product}) is not MIG capable in profile {args.simulate}")
    model = default_catalog().for_product(gpu.product)
    if args.current is not None:
        current = _sized(model, _parse_current(args.current))
    else:
        current = _profile_instances(inventory, args.gpu)
    if args.demand is not None:
        plan = plan_demand(model, current, _parse_demand(args.demand))
    else:
        plan = plan_layout(model, current, parse_profile_list(args.profiles))
    mode_on = gpu.mig_enabled or bool(current)
    if args.json:
        print(
            json.dumps(plan_to_json(plan, gpu_index=args.gpu, enable_mig=not mode_on, model=model), indent=2)
        )
    else:
        sys.stdout.write(
            render_plan(plan, gpu_index=args.gpu, product=gpu.product, model=model, mig_on=mode_on)
        )
    return 0


def _gpu(inventory: NodeInventory, index: int) -> Any:
    try:
        return inventory.gpu(index)
    except KeyError:
        known = ", ".join(str(g.index) for g in inventory.gpus)
        raise InvalidInputError(f"node {inventory.name} has no GPU {index} (GPUs: {known})") from None


def _profile_instances(inventory: NodeInventory, index: int) -> list[Instance]:
    return [
        Instance(m.profile, m.placement_start, m.placement_size, key=m.uuid)
        for m in inventory.mig_devices_of(index)
    ]


def _parse_current(text: str) -> list[Instance]:
    """``3g.40gb@0:busy,1g.10gb@6`` — every current instance needs its start slot."""
    found: list[Instance] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        spec, _, flag = part.partition(":")
        if flag not in ("", "busy"):
            raise InvalidInputError(f"bad --current entry {part!r}: the only flag is ':busy'")
        entry = parse_entry(spec)
        if entry.start is None:
            raise InvalidInputError(f"bad --current entry {part!r}: give the start slot, e.g. {spec}@0")
        found.append(
            Instance(entry.profile, entry.start, 0, busy=flag == "busy", key=f"current-{len(found)}")
        )
    return found


def _parse_demand(text: str) -> dict[str, int]:
    demand: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        profile, _, count = part.partition("=")
        if not profile or not count.isdigit():
            raise InvalidInputError(f"bad --demand entry {part!r}: expected PROFILE=COUNT, e.g. 1g.10gb=3")
        demand[profile] = demand.get(profile, 0) + int(count)
    return demand


def _sized(model: GpuModel, instances: list[Instance]) -> list[Instance]:
    return [
        Instance(i.profile, i.start, model.profile(i.profile).memory_slices, busy=i.busy, key=i.key)
        if i.size == 0
        else i
        for i in instances
    ]


def render_plan(plan: Plan, *, gpu_index: int, product: str, model: GpuModel, mig_on: bool) -> str:
    lines = [f"GPU {gpu_index} ({product}, catalog {model.key}, {model.memory_slices} memory slots)"]
    if not mig_on:
        how = "GPU reset of this GPU only" if model.resets_for_mode_change else "no reset"
        lines.append(f"  enable MIG mode ({how})")
    for instance in plan.keep:
        busy = " (busy)" if instance.busy else ""
        lines.append(f"  keep     {instance.profile:<12} start {instance.start} size {instance.size}{busy}")
    for instance in plan.destroy:
        lines.append(f"  destroy  {instance.profile:<12} start {instance.start} size {instance.size}")
    for planned in plan.create:
        lines.append(f"  create   {planned.profile:<12} start {planned.start} size {planned.size}")
    if plan.is_noop and mig_on:
        lines.append("  nothing to change")
    lines.append(
        "final layout: " + (" ".join(_slot_label(p.profile, p.start, p.size) for p in plan.final) or "empty")
    )
    lines.append("slot map:     " + _slot_map(plan, model))
    return "\n".join(lines) + "\n"


def _slot_label(profile: str, start: int, size: int) -> str:
    slots = f"{start}" if size == 1 else f"{start}-{start + size - 1}"
    return f"[{slots}] {profile}"


def _slot_map(plan: Plan, model: GpuModel) -> str:
    cells = ["."] * model.memory_slices
    for number, planned in enumerate(plan.final):
        for slot in range(planned.start, planned.start + planned.size):
            cells[slot] = chr(ord("A") + number)
    return " ".join(cells)


def plan_to_json(plan: Plan, *, gpu_index: int, enable_mig: bool, model: GpuModel) -> dict[str, Any]:
    def placed(profile: str, start: int, size: int) -> dict[str, Any]:
        return {"profile": profile, "start": start, "size": size}

    return {
        "gpu": gpu_index,
        "model": model.key,
        "enableMig": enable_mig,
        "keep": [placed(i.profile, i.start, i.size) | {"busy": i.busy} for i in plan.keep],
        "destroy": [placed(i.profile, i.start, i.size) for i in plan.destroy],
        "create": [placed(p.profile, p.start, p.size) for p in plan.create],
        "final": [placed(p.profile, p.start, p.size) for p in plan.final],
    }


# -- apply ---------------------------------------------------------------------------------------


def run_apply(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"gpu": args.gpu}
    if args.whole:
        params["whole"] = True
    else:
        params["profiles"] = [
            e.profile if e.start is None else f"{e.profile}@{e.start}"
            for e in parse_profile_list(args.profiles)
        ]
    result = call_agent(args.state_dir, "mig.apply", params, timeout=args.timeout)
    sys.stdout.write(render_apply(result))
    return 0


def render_apply(result: dict[str, Any]) -> str:
    lines = [f"GPU {result.get('gpu')} ({result.get('gpuUuid', '')})"]
    if result.get("modeChange"):
        lines.append(f"  MIG mode {result['modeChange']}")
    lines += [f"  destroyed {item}" for item in result.get("destroyed", [])]
    for item in result.get("created", []):
        lines.append(
            f"  created   {item['profile']:<12} start {item['start']} size {item['size']}  {item['uuid']}"
        )
    if not result.get("changed", True):
        lines.append("  already in the requested layout; nothing changed")
    final = result.get("final", [])
    lines.append(
        "final layout: "
        + (" ".join(_slot_label(p["profile"], p["start"], p["size"]) for p in final) or "whole GPU")
    )
    return "\n".join(lines) + "\n"
