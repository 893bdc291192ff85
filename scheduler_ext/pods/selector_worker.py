"""The selector sandbox's worker process: evaluates CEL selectors read from stdin, one per line.

A CEL program holds the GIL for as long as it runs and cannot be interrupted, so selectors that
may run long are evaluated here, in a process the extender can kill at its deadline
(``selector_sandbox``). Protocol, one JSON object per line each way::

    out: {"ready": true}                                            once, after start-up
    in:  {"expression": "<CEL>", "device": {<DeviceAttributes.as_cel()>}}
    out: {"verdict": true|false} | {"error": "<reason>"}

Answers go to the process's original stdout; file descriptor 1 then points at stderr, so
anything the CEL library prints cannot corrupt the protocol.

Every failure of one evaluation is an answer, never the end of the loop; end of input ends it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

import cel

from scheduler_ext.pods.selector import FUNCTIONS


def evaluate(expression: str, device: dict[str, Any], programs: dict[str, Any]) -> dict[str, object]:
    """One request's answer; compiled programs are kept in ``programs`` (a few, per selector)."""
    try:
        program = programs.get(expression)
        if program is None:
            program = programs[expression] = cel.compile(expression)
        value = program.execute(cel.Context(variables={"device": device}, functions=FUNCTIONS))
    except Exception as exc:  # any failure of the selector is its answer, not the worker's end
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    if isinstance(value, bool):
        return {"verdict": value}
    return {"error": f"selector returned {type(value).__name__}, not bool"}


def serve(source: IO[str], sink: IO[str]) -> None:
    programs: dict[str, Any] = {}
    sink.write(json.dumps({"ready": True}) + "\n")
    sink.flush()
    for line in source:
        try:
            request = json.loads(line)
            answer = evaluate(str(request["expression"]), dict(request["device"]), programs)
        except (ValueError, KeyError, TypeError) as exc:
            answer = {"error": f"bad sandbox request: {exc}"}
        if len(programs) > 1_000:
            programs.clear()
        sink.write(json.dumps(answer) + "\n")
        sink.flush()


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
