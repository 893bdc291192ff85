"""The exerciser's kernels, hand-written PTX the driver's JIT compiles (no CUDA toolkit needed).

``.version 7.0`` / ``.target sm_70``: every GPU from Volta on runs them (the driver compiles PTX
for the GPU it loads on), and PTX ISA 7.0 is accepted by every driver since CUDA 11.0.

- ``gw_fill(base, words, seed)`` writes word ``i`` of the region with ``pattern(i, seed)``, an
  address-dependent value (a stuck bit or a swapped address line changes what is read back);
- ``gw_check(base, words, seed, result)`` reads every word back, counts the mismatches into
  ``result[0]`` (u64) and keeps the lowest mismatching word index in ``result[1]`` (u64, start it
  at all ones). Run with a seed and its complement, every bit of every word holds a 0 and a 1;
- ``gw_compute(out, iterations, a, c)``: each thread starts from its global index and applies
  ``x = a*x + c`` (32-bit) ``8*iterations`` times, then adds ``x`` into ``out[0]``. The multiplier
  and increment are parameters, so nothing can be folded at compile time, and the sum over every
  thread has a closed form (``compute_answer``) the host checks.

``parse``/``validate`` read a kernel set back (version, target, entries and their parameter
counts), so a plan is refused before it reaches a driver if a kernel it names is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hardware.exerciser.protocol import ExerciserError

PTX_VERSION = (7, 0)
PTX_TARGET = "sm_70"
GOLDEN = 0x9E3779B1  # the pattern's multiplier (2^32 / golden ratio, odd: a bijection on words)
LCG_A, LCG_C = 1664525, 1013904223  # Numerical Recipes' 32-bit LCG
MASK32 = 0xFFFFFFFF
FILL, CHECK, COMPUTE = "gw_fill", "gw_check", "gw_compute"
PARAMS = {FILL: 3, CHECK: 4, COMPUTE: 4}

_INDEX = """
    mov.u32         %r2, %ctaid.x;
    mov.u32         %r3, %ntid.x;
    mov.u32         %r4, %tid.x;
    mul.wide.u32    %rd3, %r2, %r3;
    cvt.u64.u32     %rd4, %r4;
    add.u64         %rd3, %rd3, %rd4;
    mov.u32         %r5, %nctaid.x;
    mul.wide.u32    %rd5, %r5, %r3;"""

_PATTERN = """
    cvt.u32.u64     %r6, %rd3;
    shr.u64         %rd6, %rd3, 32;
    cvt.u32.u64     %r7, %rd6;
    mul.lo.u32      %r6, %r6, 0x9E3779B1;
    xor.b32         %r6, %r6, %r7;
    xor.b32         %r6, %r6, %r1;
    shl.b64         %rd7, %rd3, 2;
    add.u64         %rd8, %rd1, %rd7;"""

KERNELS = f"""//
// gpuweave active-check kernels (hardware/exerciser/ptx.py)
//
.version {PTX_VERSION[0]}.{PTX_VERSION[1]}
.target {PTX_TARGET}
.address_size 64

.visible .entry gw_fill(
    .param .u64 gw_fill_base,
    .param .u64 gw_fill_words,
    .param .u32 gw_fill_seed
)
{{
    .reg .pred      %p<2>;
    .reg .b32       %r<8>;
    .reg .b64       %rd<9>;

    ld.param.u64    %rd1, [gw_fill_base];
    ld.param.u64    %rd2, [gw_fill_words];
    ld.param.u32    %r1, [gw_fill_seed];
    cvta.to.global.u64 %rd1, %rd1;{_INDEX}
    setp.ge.u64     %p1, %rd3, %rd2;
    @%p1 bra        FILL_DONE;
FILL_LOOP:{_PATTERN}
    st.global.u32   [%rd8], %r6;
    add.u64         %rd3, %rd3, %rd5;
    setp.lt.u64     %p1, %rd3, %rd2;
    @%p1 bra        FILL_LOOP;
FILL_DONE:
    ret;
}}

.visible .entry gw_check(
    .param .u64 gw_check_base,
    .param .u64 gw_check_words,
    .param .u32 gw_check_seed,
    .param .u64 gw_check_result
)
{{
    .reg .pred      %p<3>;
    .reg .b32       %r<9>;
    .reg .b64       %rd<11>;

    ld.param.u64    %rd1, [gw_check_base];
    ld.param.u64    %rd2, [gw_check_words];
    ld.param.u32    %r1, [gw_check_seed];
    ld.param.u64    %rd9, [gw_check_result];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd9, %rd9;{_INDEX}
    setp.ge.u64     %p1, %rd3, %rd2;
    @%p1 bra        CHECK_DONE;
CHECK_LOOP:{_PATTERN}
    ld.global.u32   %r8, [%rd8];
    setp.eq.u32     %p2, %r8, %r6;
    @%p2 bra        CHECK_NEXT;
    atom.global.add.u64 %rd10, [%rd9], 1;
    atom.global.min.u64 %rd10, [%rd9+8], %rd3;
CHECK_NEXT:
    add.u64         %rd3, %rd3, %rd5;
    setp.lt.u64     %p1, %rd3, %rd2;
    @%p1 bra        CHECK_LOOP;
CHECK_DONE:
    ret;
}}

.visible .entry gw_compute(
    .param .u64 gw_compute_out,
    .param .u32 gw_compute_iterations,
    .param .u32 gw_compute_a,
    .param .u32 gw_compute_c
)
{{
    .reg .pred      %p<2>;
    .reg .b32       %r<11>;
    .reg .b64       %rd<2>;

    ld.param.u64    %rd1, [gw_compute_out];
    ld.param.u32    %r1, [gw_compute_iterations];
    ld.param.u32    %r2, [gw_compute_a];
    ld.param.u32    %r3, [gw_compute_c];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32         %r4, %ctaid.x;
    mov.u32         %r5, %ntid.x;
    mov.u32         %r6, %tid.x;
    mad.lo.u32      %r7, %r4, %r5, %r6;
    mov.u32         %r8, 0;
    setp.eq.u32     %p1, %r1, 0;
    @%p1 bra        COMPUTE_DONE;
COMPUTE_LOOP:
{"".join("    mad.lo.u32      %r7, %r7, %r2, %r3;" + chr(10) for _ in range(8))}\
    add.u32         %r8, %r8, 1;
    setp.lt.u32     %p1, %r8, %r1;
    @%p1 bra        COMPUTE_LOOP;
COMPUTE_DONE:
    atom.global.add.u32 %r9, [%rd1], %r7;
    ret;
}}
"""


@dataclass(frozen=True)
class KernelSet:
    version: tuple[int, int]
    target: str
    entries: dict[str, int]  # entry name -> parameter count


_VERSION = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)\s*$", re.MULTILINE)
_TARGET = re.compile(r"^\s*\.target\s+(sm_\d+)\s*$", re.MULTILINE)
_ENTRY = re.compile(r"\.visible\s+\.entry\s+(\w+)\s*\(([^)]*)\)", re.DOTALL)


def parse(text: str) -> KernelSet:
    """The version, target and entries of a PTX module; ``ExerciserError`` when it is not one."""
    version, target = _VERSION.search(text), _TARGET.search(text)
    if version is None or target is None:
        raise ExerciserError("PTX text has no .version or no .target line")
    if text.count("{") != text.count("}"):
        raise ExerciserError("PTX text has unbalanced braces")
    entries = {m.group(1): len(re.findall(r"\.param\b", m.group(2))) for m in _ENTRY.finditer(text)}
    return KernelSet((int(version.group(1)), int(version.group(2))), target.group(1), entries)


def validate(text: str, wanted: dict[str, int]) -> KernelSet:
    """Check that ``text`` targets sm_70 or older with PTX ISA 7.0 or older and defines each
    ``wanted`` entry with its parameter count; returns what it parsed."""
    kernels = parse(text)
    if kernels.version > PTX_VERSION:
        raise ExerciserError(
            f"PTX ISA {kernels.version} is newer than {PTX_VERSION}: older drivers refuse it"
        )
    if int(kernels.target.removeprefix("sm_")) > int(PTX_TARGET.removeprefix("sm_")):
        raise ExerciserError(f"PTX target {kernels.target} excludes GPUs older than it; use {PTX_TARGET}")
    for name, count in wanted.items():
        if name not in kernels.entries:
            raise ExerciserError(f"PTX has no entry {name} (it has {', '.join(sorted(kernels.entries))})")
        if kernels.entries[name] != count:
            raise ExerciserError(f"PTX entry {name} takes {kernels.entries[name]} parameters, not {count}")
    return kernels


def pattern(index: int, seed: int) -> int:
    """The word ``gw_fill`` writes at word ``index`` (what ``gw_check`` expects there)."""
    return ((index & MASK32) * GOLDEN & MASK32) ^ (index >> 32 & MASK32) ^ (seed & MASK32)


def _lcg_power(steps: int, a: int, c: int) -> tuple[int, int]:
    """(A, C) with ``x -> A*x + C`` equal to ``steps`` applications of ``x -> a*x + c`` (mod 2^32)."""
    total_a, total_c = 1, 0
    step_a, step_c = a & MASK32, c & MASK32
    while steps:
        if steps & 1:
            total_a, total_c = total_a * step_a & MASK32, (step_a * total_c + step_c) & MASK32
        step_a, step_c = step_a * step_a & MASK32, (step_a * step_c + step_c) & MASK32
        steps >>= 1
    return total_a, total_c


def compute_answer(threads: int, iterations: int, *, a: int = LCG_A, c: int = LCG_C) -> int:
    """``out[0]`` after ``gw_compute`` over ``threads`` threads (starting from 0): the sum of every
    thread's final value, mod 2^32."""
    big_a, big_c = _lcg_power(8 * iterations, a, c)
    return (big_a * (threads * (threads - 1) // 2) + threads * big_c) & MASK32
