"""How ``gpuweave status`` prints: tables for an 80-column terminal, JSON for scripts.

Every line the text form prints is at most ``WIDTH`` characters: long cells are wrapped onto
continuation lines (reasons, pod lists) or cut with an ellipsis (names), never left to the
terminal to fold, so columns stay columns in a narrow window and in `watch`. The node's GPU
product goes in its header (one line per product on a mixed node), not in every GPU row.

Much of what is shown is text a pod's author or another program wrote: pod names and gang names
in a snapshot, a gpu-selector, reasons quoting them, the message kube-scheduler left on a pending
pod. Before any layout every string of the rows goes through ``devicemodel.text.safe_text``
(``for_terminal``): control and bidi characters escaped, each field at most ``MAX_SHOWN_CHARS``
characters, so nothing reaches the terminal as a control sequence and a 1 MB message costs one
clipped paragraph. JSON escapes by itself; its strings are clipped only (``MAX_JSON_CHARS``).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import Any

from devicemodel.text import MAX_JSON_CHARS, MAX_SHOWN_CHARS, clip_text, safe_text
from gpuweave.status.explain import Pending, Placed, Ranked
from gpuweave.status.rows import HEALTHY, RETIRED, ClusterStatus, GpuRow, NodeRow, fragment_percent, gpus

WIDTH = 80
GPU_COLUMNS = (("GPU", 4), ("MODE", 11), ("HEALTH", 11), ("FREE", 9), ("PODS", 37))
RANK_COLUMNS = (("NODE", 22), ("SCORE", 5), ("GPUS", 15), ("REASON", 32))
MAX_RANKED = 8


def fit(line: str, width: int = WIDTH) -> str:
    line = line.rstrip()
    return line if len(line) <= width else line[: width - 1] + "…"


def _row(columns: Sequence[tuple[str, int]], cells: Sequence[str]) -> str:
    parts = [fit(cell, width).ljust(width) for (_, width), cell in zip(columns, cells, strict=True)]
    return fit(" ".join(parts))


def _wrapped(text: str, *, first: str, rest: str) -> list[str]:
    wrapped = textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)
    return wrapped or [first.rstrip()]


def for_terminal(value: Any) -> Any:
    """``value`` (rows, an explanation, or any part of them) with every string in it escaped and
    clipped by ``safe_text``; dataclasses are copied, numbers kept."""
    if isinstance(value, str):
        return safe_text(value, limit=MAX_SHOWN_CHARS)
    if isinstance(value, tuple | list):
        return type(value)(map(for_terminal, value))
    if isinstance(value, dict):
        return {for_terminal(k): for_terminal(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        shown = {f.name: for_terminal(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **shown)
    return value


# ---- status -----------------------------------------------------------------------------------
def status_text(status: ClusterStatus) -> str:
    status = for_terminal(status)
    every = [g for n in status.nodes for g in n.gpus]
    withheld = sum(1 for g in every if g.health not in (HEALTHY, RETIRED))
    retired = sum(1 for g in every if g.health == RETIRED)
    held = sum(1 for g in every if g.holders or any(m.holder for m in g.migs))
    free = sum(n.free_gpus for n in status.nodes)
    percent = fragment_percent(status.fragment_milli, status.idle_milli)
    lines = [
        fit(f"{len(status.nodes)} GPU node{'' if len(status.nodes) == 1 else 's'}, {len(every)} GPUs: "
            f"{free} free, {held} in use, "
            f"{withheld} withheld, {retired} retired"),
        fit(f"cluster fragment {gpus(status.fragment_milli):.2f} of {gpus(status.idle_milli):.2f} idle GPUs "
            f"({percent:.1f}%), {status.mix}"),
    ]
    for node in status.nodes:
        lines += ["", *_node_lines(node)]
    if status.without_inventory:
        names = ", ".join(status.without_inventory)
        lines += ["", *_wrapped(f"{len(status.without_inventory)} node(s) without a GpuNodeInventory "
                                f"(no gpuweave node agent): {names}", first="", rest="  ")]
    lines += _pending_pod_lines(status)
    lines += _bad_hardware_lines(status)
    return "\n".join(lines)


def _pending_pod_lines(status: ClusterStatus) -> list[str]:
    """Each pending pod: its name and request, then kube-scheduler's reason, wrapped."""
    if not status.pending:
        return []
    count = len(status.pending)
    plural = "" if count == 1 else "s"
    lines = ["", fit(f"PENDING ({count} pod{plural} of gpuweave-scheduler asking for GPUs)")]
    for row in status.pending:
        lines += _wrapped(f"{row.pod}: {row.asks}", first="  ", rest="      ")
        since = f" (since {row.since})" if row.since else ""
        lines += _wrapped(f"{row.reason}{since}", first="      ", rest="      ")
    lines.append("  what would make one fit: gpuweave status --explain NAMESPACE/POD")
    return lines


def _node_lines(node: NodeRow) -> list[str]:
    products = Counter(g.product for g in node.gpus)
    percent = fragment_percent(node.fragment_milli, node.idle_milli)
    lines = [fit(f"NODE {node.name}  {node.topology}  {node.pods} pod(s)")]
    lines += [fit(f"  {count} x {product}") for product, count in sorted(products.items())]
    lines.append(fit(f"  {node.free_gpus} of {len(node.gpus)} GPUs free, fragment "
                     f"{gpus(node.fragment_milli):.2f} of {gpus(node.idle_milli):.2f} idle ({percent:.0f}%)"))
    lines.append(_row(GPU_COLUMNS, [name for name, _ in GPU_COLUMNS]))
    for gpu in node.gpus:
        lines += _gpu_lines(gpu, mixed=len(products) > 1)
    for nic, reason in node.unhealthy_nics:
        lines += _wrapped(f"NIC {nic} withheld: {reason or 'unhealthy'}", first="  ", rest="      ")
    return lines


def _gpu_lines(gpu: GpuRow, *, mixed: bool) -> list[str]:
    pods = [f"{h.pod}" if h.holds == "whole" else f"{h.pod} ({h.holds})" for h in gpu.holders]
    first = pods[0] if pods else ""
    lines = [_row(GPU_COLUMNS, [f"{gpu.index:>3}", gpu.sharing, gpu.health, gpu.free, first])]
    lines += [_row(GPU_COLUMNS, ["", "", "", "", pod]) for pod in pods[1:]]
    if mixed:
        lines.append(fit(f"      {gpu.product}"))
    if gpu.reason:
        lines += _wrapped(gpu.reason, first="      ", rest="      ")
    for use in gpu.usage:
        limit = f" of {use.memory_limit_bytes / 2**30:.1f}" if use.memory_limit_bytes is not None else ""
        used = f"{use.utilization:.0%} SMs, {use.memory_bytes / 2**30:.1f}{limit} GiB"
        lines += _wrapped(f"{use.pod}/{use.container}: {used}", first="      use ", rest="          ")
    for mig in gpu.migs:
        lines.append(_row(GPU_COLUMNS, ["", f" {mig.profile}", mig.health, "held" if mig.holder else
                                        "free" if mig.health == HEALTHY else "-", mig.holder]))
        if mig.reason and mig.reason != gpu.reason:
            lines += _wrapped(mig.reason, first="        ", rest="        ")
    return lines


def _bad_hardware_lines(status: ClusterStatus) -> list[str]:
    if not status.bad_hardware:
        return []
    count = len(status.bad_hardware)
    lines = ["", f"BAD-HARDWARE LIST ({count} GPU{'' if count == 1 else 's'}, kept out of service)"]
    for entry in status.bad_hardware:
        lines.append(fit(f"  {entry.uuid}  node {entry.node or '?'}  {entry.strikes} strike(s)  "
                         f"since {entry.since or '?'}"))
        if entry.reason:
            lines += _wrapped(entry.reason, first="      ", rest="      ")
    return lines


# ---- explain ----------------------------------------------------------------------------------
def explain_text(answer: Pending | Placed) -> str:
    answer = for_terminal(answer)
    return "\n".join(_pending_lines(answer) if isinstance(answer, Pending) else _placed_lines(answer))


def _pending_lines(answer: Pending) -> list[str]:
    lines = _wrapped(f"pod {answer.pod} is pending; it asks for {answer.asks}", first="", rest="  ")
    lines.append(fit(f"gpuweave: {len(answer.available)}/{answer.total} nodes are available:"))
    for reason, count in answer.reasons:
        lines += _wrapped(reason, first=f"  {count} node(s): ", rest="      ")
    if answer.scheduler_said:
        lines += _wrapped(answer.scheduler_said, first="kube-scheduler said: ", rest="  ")
    lines.append("what would make it fit:")
    for hint in answer.hints:
        lines += _wrapped(hint, first="  - ", rest="    ")
    return lines


def _placed_lines(answer: Placed) -> list[str]:
    lines = _wrapped(f"pod {answer.pod} runs on node {answer.node}; it asks for {answer.asks}",
                     first="", rest="  ")
    several = len({g.container for g in answer.devices}) > 1
    devices = "; ".join(f"{g.container}: {g.text}" if several else g.text for g in answer.devices)
    lines += _wrapped(devices or "none recorded (no gpuweave.io/assignment annotation)",
                      first="devices: ", rest="  ")
    score = answer.topology
    if score is not None:
        links = "all pairs NVLink" if score.all_nvlink else "not all pairs NVLink"
        relative = 100.0 * score.value / answer.best_value if answer.best_value else 100.0
        text = (f"{links}, slowest pair {score.bottleneck_gbps:.0f} GB/s, "
                f"mean {score.mean_pair_gbps:.0f} GB/s, {score.numa_nodes} NUMA node(s), "
                f"{score.pcie_switches} PCIe switch(es); set value {score.value:.1f} of "
                f"{answer.best_value:.1f} for the best {len(score.gpus)} GPU(s) on this node "
                f"({relative:.0f}%)")
        lines += _wrapped(text, first="topology: ", rest="  ")
    lines.append("nodes ranked for its request (its own devices counted free; * its node):")
    lines.append(_row(RANK_COLUMNS, [name for name, _ in RANK_COLUMNS]))
    for ranked in answer.ranking[:MAX_RANKED]:
        lines += _ranked_lines(ranked, here=ranked.node == answer.node)
    if len(answer.ranking) > MAX_RANKED:
        lines.append(f"  ... {len(answer.ranking) - MAX_RANKED} more node(s)")
    return lines


def _ranked_lines(ranked: Ranked, *, here: bool) -> list[str]:
    score = str(ranked.score) if ranked.fits else "-"
    picked = ",".join(map(str, ranked.gpus)) if ranked.fits and ranked.gpus else ""
    reason_width = RANK_COLUMNS[-1][1]
    reason = textwrap.wrap(ranked.reason, reason_width) if ranked.reason else [""]
    node = fit(ranked.node, RANK_COLUMNS[0][1] - 2) + (" *" if here else "")
    lines = [_row(RANK_COLUMNS, [node, score, picked, reason[0]])]
    lines += [_row(RANK_COLUMNS, ["", "", "", part]) for part in reason[1:]]
    return lines


# ---- JSON -------------------------------------------------------------------------------------
def to_json(value: ClusterStatus | Pending | Placed) -> str:
    """The rows as JSON with camelCase keys (as Kubernetes objects spell theirs)."""
    document = _camel(dataclasses.asdict(value))
    if isinstance(value, Pending):
        document["reasons"] = [{"reason": _camel(r), "nodes": n} for r, n in value.reasons]
    return json.dumps(document, indent=2)


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {_camel_key(k): _camel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_camel(v) for v in value]
    if isinstance(value, str):  # JSON escapes control characters itself; a huge one is still cut
        return clip_text(value, limit=MAX_JSON_CHARS)
    return value


def _camel_key(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.capitalize() for part in rest)

