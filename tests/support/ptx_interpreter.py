"""A small PTX interpreter for the exerciser's kernels: runs them on the CPU, thread by thread.

It knows exactly the instructions ``hardware/exerciser/ptx.py`` uses and refuses anything else,
checks every register against its ``.reg`` declaration, and executes each thread of a grid to
completion in turn (the kernels have no barriers or shared memory; atomics then serialise as the
hardware's do). Global memory is a ``bytearray`` mapped at ``BASE``. The point is to prove the
hand-written PTX computes what the host expects (``pattern``, ``compute_answer``) before a GPU
host ever JIT-compiles it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BASE = 0x10000
_MASK = {"32": (1 << 32) - 1, "64": (1 << 64) - 1}


_BINARY = {
    "add": lambda a, b: a + b,
    "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b,
    "shr": lambda a, b: a >> b,
    "mul": lambda a, b: a * b,
}


class PtxError(Exception):
    pass


@dataclass
class Kernel:
    name: str
    params: list[tuple[str, str]]  # (type, name)
    regs: dict[str, int]  # prefix (%r, %rd, %p) -> count declared
    lines: list[str]
    labels: dict[str, int] = field(default_factory=dict)


def kernels(text: str) -> dict[str, Kernel]:
    found = {}
    for match in re.finditer(r"\.visible\s+\.entry\s+(\w+)\s*\(([^)]*)\)\s*\{(.*?)\n\}", text, re.DOTALL):
        name, params_text, body = match.groups()
        params = re.findall(r"\.param\s+\.(\w+)\s+(\w+)", params_text)
        regs = {f"%{p}": int(n) for p, n in re.findall(r"\.reg\s+\.\w+\s+%(\w+)<(\d+)>;", body)}
        lines = []
        for raw in body.splitlines():
            line = raw.split("//")[0].strip()
            if line and not line.startswith(".reg"):
                lines.append(line)
        kernel = Kernel(name, params, regs, [])
        for line in lines:
            if line.endswith(":"):
                kernel.labels[line[:-1]] = len(kernel.lines)
            else:
                kernel.lines.append(line.rstrip(";"))
        found[name] = kernel
    return found


class Machine:
    def __init__(self, memory_bytes: int) -> None:
        self.memory = bytearray(memory_bytes)

    def load(self, address: int, width: int) -> int:
        offset = address - BASE
        if not 0 <= offset <= len(self.memory) - width // 8:
            raise PtxError(f"load outside memory at {address:#x}")
        return int.from_bytes(self.memory[offset : offset + width // 8], "little")

    def store(self, address: int, width: int, value: int) -> None:
        offset = address - BASE
        if not 0 <= offset <= len(self.memory) - width // 8:
            raise PtxError(f"store outside memory at {address:#x}")
        self.memory[offset : offset + width // 8] = (value & _MASK[str(width)]).to_bytes(width // 8, "little")

    def launch(self, kernel: Kernel, *, grid: int, block: int, args: list[int]) -> None:
        if len(args) != len(kernel.params):
            raise PtxError(f"{kernel.name} takes {len(kernel.params)} parameters, got {len(args)}")
        params = {name: value for (_, name), value in zip(kernel.params, args, strict=True)}
        for block_id in range(grid):
            for thread in range(block):
                special = {"%ctaid.x": block_id, "%ntid.x": block, "%tid.x": thread, "%nctaid.x": grid}
                _Thread(self, kernel, params, special).run()


class _Thread:
    def __init__(self, machine: Machine, kernel: Kernel, params: dict[str, int], special: dict[str, int]):
        self.m, self.k, self.params, self.special = machine, kernel, params, special
        self.regs: dict[str, int] = {}

    def reg_name(self, name: str) -> str:
        prefix, number = re.fullmatch(r"(%[a-z]+)(\d+)", name).groups()  # type: ignore[union-attr]
        if prefix not in self.k.regs or int(number) >= self.k.regs[prefix]:
            raise PtxError(f"{self.k.name}: register {name} is not declared")
        return name

    def value(self, operand: str) -> int:
        if operand in self.special:
            return self.special[operand]
        if operand.startswith("%"):
            name = self.reg_name(operand)
            if name not in self.regs:
                raise PtxError(f"{self.k.name}: {name} read before written")
            return self.regs[name]
        return int(operand, 0)

    def address(self, operand: str) -> int:
        inner = operand.strip("[]")
        if inner in self.params:
            return self.params[inner]
        base, _, offset = inner.partition("+")
        return self.value(base) + (int(offset) if offset else 0)

    def set(self, name: str, value: int, bits: str) -> None:
        self.regs[self.reg_name(name)] = value & _MASK[bits]

    def run(self) -> None:
        pc, steps = 0, 0
        while pc < len(self.k.lines):
            steps += 1
            if steps > 10_000_000:
                raise PtxError(f"{self.k.name}: no end after {steps} instructions")
            jump = self.step(self.k.lines[pc])
            if jump == "ret":
                return
            pc = self.k.labels[jump] if jump else pc + 1

    def step(self, line: str) -> str | None:
        guard = None
        if line.startswith("@"):
            guard, line = line.split(None, 1)
        opcode, _, rest = line.partition(" ")
        ops = [o.strip() for o in rest.split(",")] if rest else []
        if guard is not None:
            negate = guard.startswith("@!")
            taken = bool(self.value(guard.lstrip("@!")))
            if taken == negate:
                return None
        parts = opcode.split(".")
        bits = next((p[1:] for p in reversed(parts) if p[1:] in _MASK), "32")
        base = parts[0]
        if base == "ret":
            return "ret"
        if base == "bra":
            return ops[0]
        if opcode.startswith("ld.param"):
            self.set(ops[0], self.address(ops[1]), bits)
        elif opcode == "cvta.to.global.u64" or base == "mov":
            self.set(ops[0], self.value(ops[1]), bits)
        elif opcode == "mul.wide.u32":
            self.set(ops[0], self.value(ops[1]) * self.value(ops[2]), "64")
        elif opcode in ("cvt.u64.u32", "cvt.u32.u64"):
            self.set(ops[0], self.value(ops[1]), parts[1][1:])
        elif base in ("add", "xor", "shl", "shr") or opcode == "mul.lo.u32":
            a, b = self.value(ops[1]), self.value(ops[2])
            self.set(ops[0], _BINARY[base](a, b), bits)
        elif opcode == "mad.lo.u32":
            self.set(ops[0], self.value(ops[1]) * self.value(ops[2]) + self.value(ops[3]), "32")
        elif base == "setp":
            a, b = self.value(ops[1]), self.value(ops[2])
            result = {"ge": a >= b, "lt": a < b, "eq": a == b, "ne": a != b}[parts[1]]
            self.set(ops[0], int(result), "32")
        elif opcode == "st.global.u32":
            self.m.store(self.address(ops[0]), 32, self.value(ops[1]))
        elif opcode == "ld.global.u32":
            self.set(ops[0], self.m.load(self.address(ops[1]), 32), "32")
        elif base == "atom":
            self.atom(parts, ops, int(bits))
        else:
            raise PtxError(f"{self.k.name}: instruction {opcode!r} is not one the interpreter knows")
        return None

    def atom(self, parts: list[str], ops: list[str], width: int) -> None:
        address = self.address(ops[1])
        old, operand = self.m.load(address, width), self.value(ops[2])
        new = old + operand if parts[2] == "add" else min(old, operand)
        self.m.store(address, width, new)
        self.set(ops[0], old, str(width))
