"""The workload the scorer places against: learned online from the pods the extender sees.

FGD-style scoring asks "how much of this node's idle GPU could the tasks that arrive next still
use?", so it needs the mix of tasks that arrive. A running extender learns it from the pods it
filters: each pod's shape (GPU share in milli-GPU or whole-GPU count, GPU-type constraint, CPU,
host memory) is counted once, and counts decay with a half-life of ``half_life_pods`` pods, so
the mix follows the cluster when its jobs change. A cold start uses ``COLD_START_PRIOR`` with the
weight of ``prior_pods`` pods, which the first few hundred pods outvote.
``gpuweave extender --workload FILE`` pins the mix instead (the benchmark writes that file from
the trace, ``workload_document``); then nothing is learned.

Units: one ``gpuweave.io/gpu-compute`` unit is 1% of a GPU, so a share of c units is ``10 * c``
milli-GPU; ``nvidia.com/gpu: n`` is n GPUs of 1000 milli-GPU; a pod whose n containers each
ask for shares is n GPUs of the largest share (each container's units come from one GPU).
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import DEFAULT_REPLICAS, MILLI_PER_COMPUTE_UNIT, MILLI_PER_GPU
from devicemodel.validation import first_problem
from scheduler_ext.pods.host import HostRequest, host_requests
from scheduler_ext.pods.requests import PodRequest
from topology.fragmentation import TargetWorkload, TaskShape

MAX_SHAPES = 64  # the scorer's cost grows with the shapes kept; the rarest beyond this are dropped
SEEN_PODS = 100_000  # pods remembered so a retried filter does not count a pod twice
# Cold start: whole GPUs and common shares, the mix of the public Alibaba GPU trace rounded.
COLD_START_PRIOR = TargetWorkload(
    shapes=tuple(
        TaskShape(cpu_milli=0, gpu_milli=m, gpu_count=n)
        for m, n in ((1000, 1), (500, 1), (250, 1), (1000, 2), (1000, 8))
    ),
    probabilities=(0.5, 0.2, 0.2, 0.05, 0.05),
)
_PRODUCT = re.compile(r'productName\s*(?:==\s*"([^"]+)"|in\s*\[([^\]]*)\])')


class ShapeModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    gpu_milli: int = Field(alias="gpuMilli", ge=0, le=MILLI_PER_GPU)
    gpu_count: int = Field(default=1, alias="gpuCount", ge=0, le=64)
    gpu_types: str = Field(default="", alias="gpuTypes")
    cpu_milli: int = Field(default=0, alias="cpuMilli", ge=0)
    memory_mib: int = Field(default=0, alias="memoryMiB", ge=0)
    weight: float = Field(gt=0)


class WorkloadFileModel(BaseModel):
    """``--workload FILE``: shapes with relative weights (any scale; they are normalised)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    api_version: str = Field(default="gpuweave.io/v1alpha1", alias="apiVersion")
    kind: str = "Workload"
    shapes: list[ShapeModel] = Field(min_length=1)


@dataclass(frozen=True)
class LearnedMix:
    """One version of the mix: ``version`` changes whenever ``workload`` does."""

    version: int
    workload: TargetWorkload
    pods_seen: int
    pinned: bool


def load_workload_file(path: Path) -> TargetWorkload:
    """Read a ``--workload`` file (YAML or JSON); a bad file is one line naming the problem."""
    try:
        data = yaml.safe_load(path.read_text())
        model = WorkloadFileModel.model_validate(data)
    except OSError as exc:
        raise InvalidInputError(f"cannot read --workload {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"--workload {path} is not YAML or JSON: {exc}") from exc
    except ValidationError as exc:
        where, message = first_problem(exc, whole="the file")
        raise InvalidInputError(f"--workload {path}: at {where}: {message}; see docs/extender.md") from exc
    weights: dict[TaskShape, float] = {}
    memory: dict[TaskShape, int] = {}
    for item in model.shapes:
        shape = _shape_of(item)
        weights[shape] = weights.get(shape, 0.0) + item.weight
        memory[shape] = item.memory_mib
    return _normalised(weights, memory)


def _shape_of(item: ShapeModel) -> TaskShape:
    count = item.gpu_count if item.gpu_milli else 0
    return TaskShape(item.cpu_milli, item.gpu_milli if count else 0, count, item.gpu_types)


def workload_document(workload: TargetWorkload) -> dict[str, Any]:
    """The ``--workload`` file for a mix (what the benchmark writes and ``GET /workload`` shows)."""
    memory = workload.memory_mib or (0,) * len(workload.shapes)
    return {
        "apiVersion": "gpuweave.io/v1alpha1",
        "kind": "Workload",
        "shapes": [
            {
                "gpuMilli": s.gpu_milli,
                "gpuCount": s.gpu_count,
                "gpuTypes": s.gpu_types,
                "cpuMilli": s.cpu_milli,
                "memoryMiB": m,
                "weight": round(p, 6),
            }
            for s, p, m in zip(workload.shapes, workload.probabilities, memory, strict=True)
        ],
    }


def _normalised(weights: Mapping[TaskShape, float], memory: Mapping[TaskShape, int]) -> TargetWorkload:
    ranked = sorted(weights.items(), key=lambda item: (-item[1], item[0]))[:MAX_SHAPES]
    total = sum(w for _, w in ranked)
    return TargetWorkload(
        shapes=tuple(s for s, _ in ranked),
        probabilities=tuple(w / total for _, w in ranked),
        memory_mib=tuple(memory.get(s, 0) for s, _ in ranked),
    )


def pod_shape(request: PodRequest, pod: Mapping[str, Any]) -> tuple[TaskShape, int] | None:
    """A pod's (shape, host memory MiB) in the scorer's units; None for MIG-only pods."""
    return request_shape(request, host_requests(pod))


def request_shape(request: PodRequest, host: HostRequest) -> tuple[TaskShape, int] | None:
    """``pod_shape`` from the pod's parsed requests and its ``host_requests`` (``parsed``)."""
    app = [c for c in request.containers if not c.init]
    if any(c.mig for c in app):
        return None
    types = _gpu_types(request.selector)
    cpu, memory = host
    whole = sum(c.gpus for c in app)
    sharing = [c for c in app if c.wants_share]
    if whole:
        return TaskShape(cpu, MILLI_PER_GPU, whole, types), memory
    if sharing:
        per_gpu = max(_share_milli(c.compute, c.shared) for c in sharing)
        return TaskShape(cpu, per_gpu, len(sharing), types), memory
    return TaskShape(cpu, 0, 0), memory


def _share_milli(compute: int, replicas: int) -> int:
    if compute:
        return min(MILLI_PER_GPU, compute * MILLI_PER_COMPUTE_UNIT)
    return min(MILLI_PER_GPU, max(1, replicas) * MILLI_PER_GPU // DEFAULT_REPLICAS)


def _gpu_types(selector: str | None) -> str:
    """The GPU models a selector allows when it names them (``productName == "X"`` / ``in [...]``)."""
    match = _PRODUCT.search(selector or "")
    if match is None:
        return ""
    if match.group(1):
        return match.group(1)
    return "|".join(sorted(part.strip().strip("\"'") for part in match.group(2).split(",") if part.strip()))


class WorkloadLearner:
    """Decayed counts of the pod shapes seen; thread-safe (filter runs on many threads).

    Weights grow geometrically instead of old counts shrinking (one multiply per pod, not one per
    shape), and are rescaled when large; the ratio between shapes is what a half-life means.
    The scorer's mix is rebuilt every ``refresh_pods`` new pods, so memoized decisions stay valid
    between rebuilds (``LearnedMix.version``).
    """

    def __init__(
        self,
        *,
        pinned: TargetWorkload | None = None,
        prior: TargetWorkload = COLD_START_PRIOR,
        prior_pods: float = 50.0,
        half_life_pods: float = 5000.0,
        refresh_pods: int = 200,
    ) -> None:
        self._growth = math.exp(math.log(2.0) / half_life_pods)
        self._refresh = refresh_pods
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._pending = 0
        source = pinned or prior
        memory = source.memory_mib or (0,) * len(source.shapes)
        self._weights = {s: p * prior_pods for s, p in zip(source.shapes, source.probabilities, strict=True)}
        self._memory = dict(zip(source.shapes, memory, strict=True))
        self._step = 1.0
        self._mix = LearnedMix(0, pinned or prior, 0, pinned is not None)

    @property
    def mix(self) -> LearnedMix:
        return self._mix

    def observe(self, uid: str, shape: TaskShape, memory_mib: int) -> None:
        """Count a pod once (by UID); a pinned workload ignores it."""
        if self._mix.pinned:
            return
        with self._lock:
            if uid in self._seen:
                return
            self._seen[uid] = None
            if len(self._seen) > SEEN_PODS:
                self._seen.popitem(last=False)
            self._step *= self._growth
            self._weights[shape] = self._weights.get(shape, 0.0) + self._step
            self._memory[shape] = memory_mib
            if self._step > 1e100:
                self._rescale()
            self._pending += 1
            if self._pending >= self._refresh:
                self._rebuild()

    def _rescale(self) -> None:
        self._weights = {s: w / self._step for s, w in self._weights.items() if w / self._step > 1e-9}
        self._step = 1.0

    def _rebuild(self) -> None:
        seen = self._mix.pods_seen + self._pending
        self._pending = 0
        workload = _normalised(self._weights, self._memory)
        self._mix = LearnedMix(self._mix.version + 1, workload, seen, pinned=False)

    def document(self) -> dict[str, Any]:
        """The current mix as a ``--workload`` document, plus how it was obtained."""
        mix = self._mix
        return workload_document(mix.workload) | {
            "status": {
                "version": mix.version,
                "podsSeen": mix.pods_seen + self._pending,
                "pinned": mix.pinned,
            }
        }
