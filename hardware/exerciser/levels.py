"""Levels of an active check and the plans that carry them out (pure).

Levels follow DCGM's diagnostic levels, so ``dcgmi diag -r LEVEL`` runs where DCGM is the backend:
1 quick (seconds; the burn-in default), 2 medium, 3 long, 4 extended. A level sets how much
memory the pattern covers, how long the compute kernel runs on the GPU model, the size and count
of timed copies, which NVLink pairs are measured and the run's default deadline.

``plans`` cuts a run into batches of at most ``max_gpus`` GPUs (a node's idle GPUs are exercised
a few at a time, never all of a busy node): each batch runs the per-GPU checks and the peer pairs
inside it; a pair whose ends fell into different batches gets a batch of its own with the copies
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import Gpu, NodeInventory
from hardware.exerciser.model import MAD_PER_ITERATION, model_for
from hardware.exerciser.protocol import GPU_CHECKS, CheckKind, ExercisePlan, GpuTarget, PeerPair

THREADS_PER_SM = 1024  # 32 warps per SM: enough in flight to hide the multiply-add latency
MIB = 1 << 20


@dataclass(frozen=True)
class Level:
    number: int
    name: str
    memory_fraction: float
    compute_s: float  # the compute kernel's time on the GPU model's boost clock
    copy_bytes: int
    copy_repeats: int
    all_pairs: bool  # every NVLink pair both ways; else each direct link once and an NVSwitch ring
    deadline_s: float


# Copies are sized for the agent's container: one pinned host buffer of ``copy_bytes`` at a time.
LEVELS: dict[int, Level] = {
    1: Level(1, "quick", 0.02, 0.2, 64 * MIB, 8, False, 120.0),
    2: Level(2, "medium", 0.25, 1.0, 128 * MIB, 8, False, 600.0),
    3: Level(3, "long", 0.85, 5.0, 256 * MIB, 16, True, 1800.0),
    4: Level(4, "extended", 0.90, 30.0, 256 * MIB, 32, True, 3600.0),
}


def level(number: int) -> Level:
    if number not in LEVELS:
        raise InvalidInputError(f"active-check level {number} does not exist; use 1 (quick) to 4 (extended)")
    return LEVELS[number]


def peer_pairs(inventory: NodeInventory, *, all_pairs: bool) -> tuple[PeerPair, ...]:
    """The NVLink pairs to measure: direct links (each both ways with ``all_pairs``), and on an
    NVSwitch fabric a ring (GPU i to the next), or every ordered pair with ``all_pairs``."""
    uuid = {g.index: g.uuid for g in inventory.gpus}
    pairs: list[PeerPair] = []
    for link in inventory.nvlinks:
        if link.gpu_a in uuid and link.gpu_b in uuid:
            pairs.append(PeerPair(uuid[link.gpu_a], uuid[link.gpu_b], link.links))
            if all_pairs:
                pairs.append(PeerPair(uuid[link.gpu_b], uuid[link.gpu_a], link.links))
    fabric = inventory.nvswitch
    members = [i for i in fabric.gpus if i in uuid] if fabric is not None else []
    if fabric is not None and len(members) > 1:
        if all_pairs:
            ordered = [(a, b) for a in members for b in members if a != b]
        else:
            ordered = [(a, members[(k + 1) % len(members)]) for k, a in enumerate(members)]
            ordered = ordered if len(members) > 2 else ordered[:1]
        pairs.extend(PeerPair(uuid[a], uuid[b], fabric.links_per_gpu) for a, b in ordered)
    return tuple(pairs)


def plans(
    inventory: NodeInventory,
    gpus: Sequence[Gpu],
    *,
    level_number: int,
    max_gpus: int,
    memory_fraction: float | None = None,
    gpu_checks: tuple[CheckKind, ...] = GPU_CHECKS,
) -> tuple[ExercisePlan, ...]:
    """The batches of one run over ``gpus`` (each of at most ``max_gpus`` GPUs); ``gpu_checks``
    the per-GPU checks of each (a gang's preflight: ``BANDWIDTH_CHECKS``, the copies only)."""
    spec = level(level_number)
    base = replace(_base_plan(spec, memory_fraction), gpu_checks=gpu_checks)
    chosen = {g.uuid for g in gpus}
    pairs = [p for p in peer_pairs(inventory, all_pairs=spec.all_pairs) if {p.src, p.dst} <= chosen]
    batches = [list(gpus[i : i + max_gpus]) for i in range(0, len(gpus), max(max_gpus, 1))]
    out = []
    for batch in batches:
        members = {g.uuid for g in batch}
        inside = tuple(p for p in pairs if {p.src, p.dst} <= members)
        out.append(_with_gpus(base, batch, inside))
    if max_gpus >= 2:
        by_uuid = {g.uuid: g for g in gpus}
        for pair in pairs:
            if not any({pair.src, pair.dst} <= {g.uuid for g in b} for b in batches):
                two = [by_uuid[pair.src], by_uuid[pair.dst]]
                out.append(replace(_with_gpus(base, two, (pair,)), peer_only=True))
    return tuple(out)


def _base_plan(spec: Level, memory_fraction: float | None) -> ExercisePlan:
    return ExercisePlan(
        level=spec.number,
        gpus=(),
        memory_fraction=spec.memory_fraction if memory_fraction is None else memory_fraction,
        copy_bytes=spec.copy_bytes,
        copy_repeats=spec.copy_repeats,
        compute_seconds=spec.compute_s,
    )


def _with_gpus(base: ExercisePlan, gpus: Sequence[Gpu], pairs: tuple[PeerPair, ...]) -> ExercisePlan:
    """The plan for these GPUs: compute sized so each GPU's model runs ``compute_seconds``."""
    threads, iterations = {}, 1
    for gpu in gpus:
        model = model_for(gpu.product, gpu.architecture)
        threads[gpu.uuid] = model.sms * THREADS_PER_SM
        trips = base.compute_seconds * model.mad_per_s / (threads[gpu.uuid] * MAD_PER_ITERATION)
        iterations = max(iterations, int(trips))
    return replace(
        base,
        gpus=tuple(GpuTarget(g.index, g.uuid, g.pci_bus_id, g.memory_mib) for g in gpus),
        pairs=pairs,
        compute_threads=threads,
        compute_iterations=min(iterations, (1 << 31) - 1),
    )
