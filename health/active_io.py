"""What an active-check run does around its exerciser: counters before and after, the backstop.

- ``CounterReader`` reads each GPU's health counters (``read_gpu``: ECC, remapped rows, the PCIe
  link) time-boxed as a round's reads are, so a hung NVML call costs the run one GPU's deltas, not
  the run; ``deltas`` turns two reads and the engine's Xid counts into ``CounterDelta`` values.
- ``run_with_backstop`` runs the exerciser on a thread and stops waiting ``grace_s`` past the
  batch's deadline: every backend returns by its deadline, and one that does not (a driver call
  that cannot be interrupted in this process) hangs every check of the batch, which fails its GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from devicemodel.inventory import Gpu, NodeInventory
from hardware.exerciser.protocol import (
    CheckResult,
    ExercisePlan,
    Exerciser,
    ExerciseReport,
    ResultStatus,
    unfinished,
)
from hardware.health_probe import GpuReadings
from health.active import CounterDelta
from health.runner import TimeoutRunner
from health.signals.gpu_checks import nvlinks_per_gpu

Link = tuple[int, int]  # PCIe generation, width


class Readings(Protocol):
    def read_gpu(self, uuid: str, *, expected_nvlinks: int) -> GpuReadings: ...


class CounterReader:
    def __init__(self, probe: Readings, *, timeout_s: float) -> None:
        self._probe = probe
        self._timeout_s = timeout_s
        self._reads = TimeoutRunner()

    def read_all(self, inventory: NodeInventory, gpus: Sequence[Gpu]) -> dict[str, GpuReadings | None]:
        """Each GPU's counters; None where the read failed, hung, or is still hung from before."""
        links = nvlinks_per_gpu(inventory)
        started = {
            g.uuid: self._reads.start(f"active/{g.uuid}", _reader(self._probe, g.uuid, links.get(g.index, 0)))
            for g in gpus
        }
        out: dict[str, GpuReadings | None] = {}
        for uuid, fresh in started.items():
            status, value = (
                self._reads.collect(f"active/{uuid}", self._timeout_s) if fresh else ("timeout", None)
            )
            out[uuid] = value if status == "ok" and isinstance(value, GpuReadings) else None
        return out


def pcie_links(readings: Mapping[str, GpuReadings | None]) -> dict[str, Link | None]:
    """Each GPU's PCIe link at its maximum generation and width (the rate it must reach under load)."""
    links: dict[str, Link | None] = {}
    for uuid, read in readings.items():
        gen, width = (read.pcie_generation, read.pcie_width) if read is not None else (None, None)
        links[uuid] = (gen[1], width[1]) if gen and width else None
    return links


def deltas(
    before: Mapping[str, GpuReadings | None],
    after: Mapping[str, GpuReadings | None],
    xids_before: Mapping[str, int],
    xids_after: Mapping[str, int],
) -> dict[str, CounterDelta]:
    out = {}
    for uuid, first in before.items():
        last = after.get(uuid)
        xids = xids_after.get(uuid, 0) - xids_before.get(uuid, 0)
        if first is None or last is None:
            out[uuid] = CounterDelta(xids=xids)
            continue
        out[uuid] = CounterDelta(
            dbe=_minus(last.volatile_dbe, first.volatile_dbe),
            sbe=_minus(last.volatile_sbe, first.volatile_sbe),
            remapped_rows=_minus(_rows(last), _rows(first)),
            pages_retired=bool(last.retired_pages_pending) and not first.retired_pages_pending,
            xids=xids,
        )
    return out


def run_with_backstop(
    exerciser: Exerciser,
    plan: ExercisePlan,
    *,
    deadline_s: float,
    grace_s: float,
    cancel: threading.Event | None = None,
) -> ExerciseReport:
    """The backend's report; every check an error when it raised, hung when it never returned."""
    box: list[ExerciseReport | BaseException] = []

    def work() -> None:
        try:
            box.append(exerciser.run(plan, deadline_s=deadline_s, cancel=cancel))
        except Exception as exc:
            box.append(exc)

    thread = threading.Thread(target=work, name="exerciser", daemon=True)
    thread.start()
    thread.join(deadline_s + grace_s)
    if box and isinstance(box[0], ExerciseReport):
        return box[0]
    if box:
        detail = f"the {exerciser.name} exerciser failed: {box[0]}"
        rest = unfinished(plan, [], hung=(), detail=detail)
        errors = tuple(
            CheckResult(r.check, r.gpu, ResultStatus.ERROR, peer=r.peer, detail=detail) for r in rest
        )
        return ExerciseReport(exerciser.name, plan, errors, 0.0)
    detail = f"the {exerciser.name} exerciser did not return within its {deadline_s:g} s deadline"
    hung = tuple(unfinished(plan, [], hung=set(plan.checks()), detail=detail))
    return ExerciseReport(exerciser.name, plan, hung, deadline_s)


def without_gpus(plan: ExercisePlan, kept: Collection[str]) -> ExercisePlan:
    """The plan with only the GPUs ``kept`` and the peer pairs between them."""
    if len(kept) == len(plan.gpus):
        return plan
    return replace(
        plan,
        gpus=tuple(g for g in plan.gpus if g.uuid in kept),
        pairs=tuple(p for p in plan.pairs if p.src in kept and p.dst in kept),
    )


def _reader(probe: Readings, uuid: str, links: int) -> Callable[[], GpuReadings]:
    return lambda: probe.read_gpu(uuid, expected_nvlinks=links)


def _minus(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else max(after - before, 0)


def _rows(readings: GpuReadings) -> int | None:
    rows = readings.remapped_rows
    return None if rows is None else rows[0] + rows[1]
