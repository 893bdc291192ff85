"""A gang's preflight on this node: what a ``GpuPreflight`` asks of the active checks, and the status
its outcome becomes (pure; ``health.preflight_kube`` reads and writes the objects).

The extender asks for the GPUs a gang will use on this node (``spec.gpus``; empty: every GPU
nothing holds) and the checks: ``bandwidth`` (host <-> device and NVLink copies: what a multi-node
job leans on) or ``full`` (every check of the level). The run is an ordinary active-check run
(trigger ``preflight``): it withholds its GPUs, skips any a pod holds, and its findings go into the
health engine as every run's do, so a GPU that fails is withheld (Suspect or Failed, cause
``active-check``; a hard memory failure goes to the bad-hardware list) for every workload, not just
this gang. The status says, per GPU, what the run found:

- ``Passed``: every GPU asked for passed;
- ``Failed``: some GPU failed (the node's health now withholds it), or the run found an NVLink pair
  among them slow that was not known degraded before (``health.links``: both GPUs stay in service,
  the link is published, and the gang is planned again knowing it; a pair already published as
  degraded when the gang was planned fails nothing);
- ``Incomplete``: none failed, but some could not be checked (a pod holds it, the run ended first);
- ``Refused``: the request names a GPU this node does not have, or is not a request at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from devicemodel.errors import InvalidInputError, clip
from devicemodel.inventory import NodeInventory
from devicemodel.preflight import MAX_MESSAGE, GpuVerdict, Phase, PreflightSpec, PreflightStatus
from hardware.exerciser.protocol import BANDWIDTH_CHECKS, GPU_CHECKS, CheckKind
from health.active_book import RunOutcome

TRIGGER = "preflight"
REASON_CHARS = 300


def checks_of(spec: PreflightSpec) -> tuple[CheckKind, ...]:
    return BANDWIDTH_CHECKS if spec.checks == "bandwidth" else GPU_CHECKS


def indexes_of(spec: PreflightSpec, inventory: NodeInventory) -> list[int] | None:
    """The GPU indexes asked for (None: every GPU); ``InvalidInputError`` for a GPU not on this node."""
    if not spec.gpus:
        return None
    by_uuid = {g.uuid.lower(): g.index for g in inventory.gpus}
    missing = [u for u in spec.gpus if u.lower() not in by_uuid]
    if missing:
        raise InvalidInputError(
            f"GPU {clip(missing[0], limit=80)} is not on node {inventory.name or 'this node'}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    return sorted({by_uuid[u.lower()] for u in spec.gpus})


def refused(why: str) -> PreflightStatus:
    return PreflightStatus(phase="Refused", message=clip(why, limit=MAX_MESSAGE - 40))


def status_for(outcome: RunOutcome) -> PreflightStatus:
    """The ``GpuPreflight`` status of a finished run (module docstring)."""
    if outcome.state != "done":
        why = f"the check did not finish: {outcome.error or outcome.state}"
        return PreflightStatus(phase="Incomplete", message=clip(why, limit=REASON_CHARS), run=outcome.run)
    gpus = {uuid: _verdict(g.verdict, g.reasons) for uuid, g in list(outcome.gpus.items())[:64]}
    verdicts = {g.verdict for g in gpus.values()}
    phase: Phase = "Passed"
    if "failed" in verdicts or outcome.new_links:
        phase = "Failed"
    elif verdicts - {"passed"} or not verdicts:
        phase = "Incomplete"
    message = outcome.summary() if verdicts else "no GPU to check on this node"
    return PreflightStatus(
        phase=phase, message=clip(message, limit=MAX_MESSAGE - 40), run=outcome.run, gpus=gpus
    )


def _verdict(verdict: str, reasons: tuple[str, ...]) -> GpuVerdict:
    reason = clip(reasons[0], limit=REASON_CHARS) if reasons else ""
    return GpuVerdict.model_validate({"verdict": verdict, "reason": reason})


def summary(status: PreflightStatus) -> Mapping[str, int]:
    """Verdict -> GPUs, for the log line."""
    counts: dict[str, int] = {}
    for gpu in status.gpus.values():
        counts[gpu.verdict] = counts.get(gpu.verdict, 0) + 1
    return counts
