"""The ``exercise`` step: the active-check exerciser on every GPU at level 1, recorded.

On a host it is the CUDA exerciser the node agent runs (``hardware.exerciser.process``: the driver
through ``libcuda.so.1`` in a child process, the hand-written PTX compiled by the driver's JIT),
never DCGM: the point is to prove gpuweave's own kernels and copies on this driver. With
``--simulate`` it is the simulator's. Each GPU's PCIe link is read through NVML first (the rate
the copies are judged against), then every check is judged as the agent judges it
(``health.active``). The recording goes to ``<out>/exerciser/<product>-<driver>.json``: the
timings and bandwidths of every check, what each was judged against and every finding, GPUs
named by index (no UUID, serial number or host name). An NVLink pair below threshold fails the
step too (the agent would keep both GPUs in service and publish the link as degraded).

Read-only to device settings: contexts, allocations, kernels, copies and peer access end with the
child process; no MIG, reset, clock, power, ECC, persistence or compute-mode call is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devicemodel.inventory import NodeInventory
from devicemodel.state_file import write_json_atomically
from gpuweave.gpucheck.process import CheckFailedError, StepSkippedError
from hardware.exerciser.levels import plans
from hardware.exerciser.model import Expectations, expectations
from hardware.exerciser.process import ProcessExerciser
from hardware.exerciser.protocol import Exerciser, ExerciseReport
from hardware.exerciser.wire import result_to_dict
from hardware.health_probe import NvmlHealthProbe
from hardware.nvml import NvmlBackend
from hardware.nvml_fixture import fixture_name
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.exerciser import SimulatedExerciser
from health.active import Thresholds, Verdict, judge, judge_links, verdicts

LEVEL = 1
EXERCISE_DEADLINE_S = 25.0  # the whole level-1 run of every GPU; a hang fails the step within it


def step_exercise(*, simulate: str | None, out_dir: Path) -> str:
    backend: SimulatedBackend | NvmlBackend = (
        SimulatedBackend(load_profile(simulate)) if simulate else NvmlBackend()
    )
    try:
        inventory = backend.discover()
        lib = backend.lib
        links = _links(NvmlHealthProbe(lib), inventory)
        exerciser: Exerciser = (
            SimulatedExerciser(backend.node.inventory, backend.node.health, backend.node.exerciser)
            if isinstance(backend, SimulatedBackend)
            else ProcessExerciser()
        )
        return _exercise(inventory, exerciser, expectations(inventory, links), out_dir, simulate=simulate)
    finally:
        backend.close()


def _links(probe: NvmlHealthProbe, inventory: NodeInventory) -> dict[str, tuple[int, int] | None]:
    """Each GPU's PCIe link at its maximum generation and width, as NVML reads it."""
    links: dict[str, tuple[int, int] | None] = {}
    for gpu in inventory.gpus:
        readings = probe.read_gpu(gpu.uuid, expected_nvlinks=0)
        gen, width = readings.pcie_generation, readings.pcie_width
        links[gpu.uuid] = (gen[1], width[1]) if gen and width else None
    return links


def _exercise(
    inventory: NodeInventory,
    exerciser: Exerciser,
    expected: Expectations,
    out_dir: Path,
    *,
    simulate: str | None,
) -> str:
    gpus = [g for g in inventory.gpus if not g.mig_enabled]
    if not gpus:
        raise StepSkippedError("every GPU has MIG mode on: the exerciser runs on whole GPUs")
    (plan,) = plans(inventory, gpus, level_number=LEVEL, max_gpus=len(gpus))
    report = exerciser.run(plan, deadline_s=EXERCISE_DEADLINE_S)
    found = judge(report, expected, thresholds=Thresholds())
    verdict = verdicts(report, found)
    target = _record(inventory, report, expected=expected, found=found, verdict=verdict, out_dir=out_dir,
                     simulate=simulate)
    failed = sorted(inventory.gpu_by_uuid(u).index for u, v in verdict.items() if v is not Verdict.PASSED)
    if failed:
        items = found.get(inventory.gpu(failed[0]).uuid) or []
        first = _anonymous(inventory, items[0].reason) if items else "not every check ran"
        raise CheckFailedError(f"GPU(s) {', '.join(map(str, failed))} failed: {first} (recorded in {target})")
    slow = sorted(
        (sorted(inventory.gpu_by_uuid(u).index for u in v.pair), v.text)
        for v in judge_links([report], expected, thresholds=Thresholds()).values()
        if v.slow
    )
    if slow:  # the agent would serve both GPUs but publish the link degraded: a host check fails it
        pairs = ", ".join(f"{a}-{b}" for (a, b), _ in slow)
        first = _anonymous(inventory, slow[0][1])
        raise CheckFailedError(f"NVLink pair(s) {pairs} slow: {first} (recorded in {target})")
    checks = len(report.results)
    return f"{len(gpus)} GPUs passed level {LEVEL} in {report.seconds:.1f}s ({checks} checks), {target}"


def _record(
    inventory: NodeInventory,
    report: ExerciseReport,
    *,
    expected: Expectations,
    found: dict[str, Any],
    verdict: dict[str, Any],
    out_dir: Path,
    simulate: str | None,
) -> Path:
    index = {g.uuid: f"gpu{g.index}" for g in inventory.gpus}
    plan = report.plan

    def anonymous(result: dict[str, Any]) -> dict[str, Any]:
        named = {"gpu": index.get(result["gpu"]), "peer": index.get(result["peer"] or "")}
        return {**result, **named, "detail": _anonymous(inventory, result["detail"])}

    document = {
        "recordedBy": "scripts/gpu-check" + (f" --simulate {simulate}" if simulate else ""),
        "source": "simulated" if simulate else "cuda",
        "product": inventory.gpus[0].product,
        "driver": inventory.driver_version,
        "level": plan.level,
        "seconds": round(report.seconds, 3),
        "plan": {
            "memoryFraction": plan.memory_fraction,
            "computeIterations": plan.compute_iterations,
            "computeSeconds": plan.compute_seconds,
            "copyBytes": plan.copy_bytes,
            "copyRepeats": plan.copy_repeats,
        },
        "expected": {
            index[g.uuid]: {
                "model": expected.model(g.uuid).name,
                "pcieGbps": expected.pcie.get(g.uuid),
                "pcieLink": expected.pcie_link.get(g.uuid),
                "computeSeconds": expected.compute_seconds(
                    g.uuid, threads=plan.threads_for(g.uuid), iterations=plan.compute_iterations
                ),
            }
            for g in plan.gpus
        },
        "results": [anonymous(result_to_dict(r)) for r in report.results],
        "verdicts": {
            index[u]: {
                "verdict": v.value,
                "findings": [_anonymous(inventory, f.reason) for f in found.get(u, [])],
            }
            for u, v in verdict.items()
        },
    }
    target = out_dir / "exerciser" / fixture_name(inventory.gpus[0].product, inventory.driver_version)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(target, document)
    return target


def _anonymous(inventory: NodeInventory, text: str) -> str:
    """``text`` with every GPU UUID replaced by ``gpu<index>``."""
    for gpu in inventory.gpus:
        text = text.replace(gpu.uuid, f"gpu{gpu.index}")
    return text
