"""The exerciser's hand-written PTX: well-formed for the driver's JIT, and computing what the host expects.

The kernels run here on ``tests/support/ptx_interpreter.py`` (every instruction they use, checked
register declarations), so a wrong pattern, a broken loop or an answer the host computes
differently fails before a GPU host ever loads the module.
"""

from __future__ import annotations

import pytest

from hardware.exerciser.protocol import ExerciserError
from hardware.exerciser.ptx import (
    CHECK,
    COMPUTE,
    FILL,
    KERNELS,
    LCG_A,
    LCG_C,
    MASK32,
    PARAMS,
    compute_answer,
    parse,
    pattern,
    validate,
)
from tests.support.ptx_interpreter import BASE, Machine, PtxError, kernels

WORDS = 70  # more words than threads: the grid-stride loop runs several trips
GRID, BLOCK = 3, 8


def test_the_kernel_set_targets_sm_70_with_ptx_7_and_has_each_entry_with_its_parameters() -> None:
    parsed = validate(KERNELS, PARAMS)
    assert parsed.version == (7, 0)
    assert parsed.target == "sm_70"
    assert parsed.entries == {FILL: 3, CHECK: 4, COMPUTE: 4}
    assert ".address_size 64" in KERNELS


@pytest.mark.parametrize(
    ("text", "wanted", "problem"),
    [
        (KERNELS.replace("gw_check(", "gw_verify("), PARAMS, "no entry gw_check"),
        (KERNELS.replace(".version 7.0", ".version 8.5"), PARAMS, "newer than"),
        (KERNELS.replace(".target sm_70", ".target sm_90"), PARAMS, "excludes GPUs older"),
        (KERNELS, {**PARAMS, FILL: 4}, "takes 3 parameters, not 4"),
        (KERNELS.replace(".version 7.0", ""), PARAMS, "no .version"),
        (KERNELS + "}", PARAMS, "unbalanced"),
    ],
)
def test_a_kernel_set_that_a_driver_would_refuse_is_refused_with_the_reason(
    text: str, wanted: dict[str, int], problem: str
) -> None:
    with pytest.raises(ExerciserError, match=problem):
        validate(text, wanted)


def _fill_and_check(machine: Machine, seed: int, *, corrupt: int | None = None) -> tuple[int, int]:
    found = kernels(KERNELS)
    result = BASE + WORDS * 4
    machine.launch(found[FILL], grid=GRID, block=BLOCK, args=[BASE, WORDS, seed])
    if corrupt is not None:
        word = machine.load(BASE + corrupt * 4, 32)
        machine.store(BASE + corrupt * 4, 32, word ^ 0x10)  # one stuck bit
    machine.store(result, 64, 0)
    machine.store(result + 8, 64, (1 << 64) - 1)
    machine.launch(found[CHECK], grid=GRID, block=BLOCK, args=[BASE, WORDS, seed, result])
    return machine.load(result, 64), machine.load(result + 8, 64)


def test_fill_writes_the_address_dependent_pattern_the_host_computes() -> None:
    machine = Machine(WORDS * 4 + 16)
    seed = 0x5EED1234
    kernels_found = kernels(KERNELS)
    machine.launch(kernels_found[FILL], grid=GRID, block=BLOCK, args=[BASE, WORDS, seed])
    words = [machine.load(BASE + 4 * i, 32) for i in range(WORDS)]
    assert words == [pattern(i, seed) for i in range(WORDS)]
    assert len(set(words)) == WORDS  # every address reads differently
    complement = Machine(WORDS * 4 + 16)
    complement.launch(kernels_found[FILL], grid=GRID, block=BLOCK, args=[BASE, WORDS, ~seed & MASK32])
    assert all(complement.load(BASE + 4 * i, 32) == w ^ MASK32 for i, w in enumerate(words))


def test_check_counts_no_mismatch_on_good_memory_and_names_the_first_bad_word() -> None:
    assert _fill_and_check(Machine(WORDS * 4 + 16), 0x5EED1234) == (0, (1 << 64) - 1)
    count, first = _fill_and_check(Machine(WORDS * 4 + 16), 0x5EED1234, corrupt=41)
    assert (count, first) == (1, 41)


def test_pattern_depends_on_the_upper_half_of_a_64_bit_word_index() -> None:
    assert pattern(5, 0) != pattern(5 + (1 << 32), 0)


@pytest.mark.parametrize(("grid", "block", "iterations"), [(2, 8, 3), (1, 32, 0), (4, 16, 11)])
def test_compute_sums_every_threads_lcg_to_the_closed_form_the_host_checks(
    grid: int, block: int, iterations: int
) -> None:
    machine = Machine(8)
    machine.launch(kernels(KERNELS)[COMPUTE], grid=grid, block=block, args=[BASE, iterations, LCG_A, LCG_C])
    expected = 0
    for start in range(grid * block):
        x = start
        for _ in range(8 * iterations):
            x = (LCG_A * x + LCG_C) & MASK32
        expected = (expected + x) & MASK32
    assert machine.load(BASE, 32) == expected == compute_answer(grid * block, iterations)


def test_the_closed_form_holds_for_a_burn_in_sized_run() -> None:
    threads, iterations = 132 * 1024, 3_093_750
    value = compute_answer(threads, iterations)
    assert 0 <= value <= MASK32
    assert value != compute_answer(threads, iterations + 1)


def test_the_interpreter_refuses_an_undeclared_register_so_the_declarations_are_checked() -> None:
    broken = KERNELS.replace(".reg .b64       %rd<9>;", ".reg .b64       %rd<8>;", 1)
    with pytest.raises(PtxError, match="%rd8 is not declared"):
        Machine(WORDS * 4).launch(kernels(broken)[FILL], grid=1, block=1, args=[BASE, 1, 0])


def test_parse_reads_entries_from_any_ptx_module() -> None:
    text = ".version 6.4\n.target sm_60\n.visible .entry k(\n .param .u64 a\n)\n{\n ret;\n}\n"
    assert parse(text).entries == {"k": 1}
