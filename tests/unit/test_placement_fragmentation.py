"""The FGD fragmentation measure: table-driven cases and vectorised == scalar reference."""

from __future__ import annotations

import numpy as np
import pytest

from devicemodel.errors import InvalidInputError
from topology.fragmentation import (
    FragmentModel,
    TargetWorkload,
    TaskShape,
    node_fragment,
    task_fragment,
    typical_workload,
    with_memory,
)

SHARE_HALF = TaskShape(cpu_milli=4000, gpu_milli=500, gpu_count=1)
WHOLE_ONE = TaskShape(cpu_milli=8000, gpu_milli=1000, gpu_count=1)
WHOLE_TWO_T4 = TaskShape(cpu_milli=8000, gpu_milli=1000, gpu_count=2, gpu_types="T4")
CPU_ONLY = TaskShape(cpu_milli=2000, gpu_milli=0, gpu_count=0)


@pytest.mark.parametrize(
    ("task", "cpu_free", "gpu_free", "model", "expected"),
    [
        # CPU-only tasks cannot use any GPU: every idle milli-GPU is fragment for them.
        (CPU_ONLY, 64000, [1000, 300], "T4", 1300),
        # Fits: only GPUs with less room than the request are fragment.
        (SHARE_HALF, 64000, [1000, 300, 600], "T4", 300),
        # Lacks CPU: all idle GPU is fragment.
        (SHARE_HALF, 3000, [1000, 300], "T4", 1300),
        # Not enough GPUs with room: all idle GPU is fragment.
        (WHOLE_TWO_T4, 64000, [1000, 900], "T4", 1900),
        (WHOLE_TWO_T4, 64000, [1000, 1000, 200], "T4", 200),
        # GPU-type constraint excludes the node.
        (WHOLE_TWO_T4, 64000, [1000, 1000], "V100M16", 2000),
        # A full node has no fragment.
        (WHOLE_ONE, 64000, [0, 0], "T4", 0),
    ],
)
def test_task_fragment_follows_the_seven_classes(
    task: TaskShape, cpu_free: int, gpu_free: list[int], model: str, expected: int
) -> None:
    assert task_fragment(cpu_free=cpu_free, gpu_free=gpu_free, gpu_model=model, task=task) == expected


def test_node_fragment_weights_tasks_by_probability() -> None:
    workload = TargetWorkload((SHARE_HALF, CPU_ONLY), (0.75, 0.25))
    # share: GPU with 300 is fragment; cpu-only: all 1300 -> 0.75*300 + 0.25*1300
    value = node_fragment(cpu_free=64000, gpu_free=[1000, 300], gpu_model="T4", workload=workload)
    assert value == pytest.approx(550.0)


def test_typical_workload_keeps_popular_shapes_until_coverage() -> None:
    tasks = [SHARE_HALF] * 6 + [WHOLE_ONE] * 3 + [CPU_ONLY]
    workload = typical_workload(tasks, coverage=0.85)
    assert workload.shapes == (SHARE_HALF, WHOLE_ONE)
    assert workload.probabilities == pytest.approx((6 / 9, 3 / 9))
    assert typical_workload(tasks, coverage=1.0).shapes == (SHARE_HALF, WHOLE_ONE, CPU_ONLY)


def test_typical_workload_rejects_an_empty_trace() -> None:
    with pytest.raises(InvalidInputError):
        typical_workload([])


def test_memory_aware_workload_counts_gpus_stranded_by_full_memory() -> None:
    plain = TargetWorkload((SHARE_HALF,), (1.0,))
    aware = with_memory(plain, [(SHARE_HALF, 16384), (SHARE_HALF, 16384)])
    assert aware.memory_mib == (16384,)
    for workload, expected in ((plain, 0), (aware, 2000)):
        value = node_fragment(
            cpu_free=64000, gpu_free=[1000, 1000], gpu_model="T4", workload=workload, memory_free=1024
        )
        assert value == expected


@pytest.mark.parametrize("memory_aware", [False, True])
def test_vectorised_model_matches_scalar_reference(memory_aware: bool) -> None:
    rng = np.random.default_rng(7)
    shapes = [
        TaskShape(int(c), int(m), 1)
        for c, m in zip(rng.integers(1, 40, 30) * 1000, rng.integers(50, 1000, 30), strict=True)
    ]
    shapes += [WHOLE_ONE, WHOLE_TWO_T4, CPU_ONLY, TaskShape(64000, 1000, 8, "V100M16|V100M32")]
    workload = typical_workload(shapes * 2 + shapes[:7], coverage=1.0)
    if memory_aware:
        workload = with_memory(workload, [(s, int(rng.integers(1, 200)) * 1024) for s in shapes])
    models = ["T4", "V100M16", "V100M32", "G2"]
    model = FragmentModel(workload, models=models, max_gpus=8)
    states = 200  # above the de-duplication threshold, with repeated rows
    cpu = rng.integers(0, 96, states) * 1000
    gpus = rng.choice([0, 1000, 1000, 500, 190, 810, 30], size=(states, 8))
    kinds = rng.integers(0, len(models), states)
    memory = rng.integers(0, 400, states) * 1024
    gpus[100:150], cpu[100:150], kinds[100:150], memory[100:150] = gpus[0], cpu[0], kinds[0], memory[0]
    vector = model.fragment(cpu, gpus, kinds, memory)
    for k in range(states):
        scalar = node_fragment(
            cpu_free=int(cpu[k]),
            gpu_free=[int(g) for g in gpus[k]],
            gpu_model=models[kinds[k]],
            workload=workload,
            memory_free=int(memory[k]),
        )
        assert vector[k] == pytest.approx(scalar, abs=1e-6)


def test_fragment_model_rejects_unknown_model_and_missing_memory() -> None:
    aware = with_memory(TargetWorkload((SHARE_HALF,), (1.0,)), [(SHARE_HALF, 1024)])
    model = FragmentModel(aware, models=["T4"])
    with pytest.raises(InvalidInputError):
        model.model_index("A100")
    one = np.asarray([64000])
    with pytest.raises(InvalidInputError):
        model.fragment(one, np.asarray([[1000]]), np.asarray([0]))
