"""Where pydantic validation failed, in the words our one-line error messages use.

Every edge that validates input (annotations, config files, control requests) reports the first
problem as ``at FIELD.PATH: MESSAGE``; this is the one place that reads it out of the error.
"""

from __future__ import annotations

from pydantic import ValidationError


def first_problem(exc: ValidationError, *, whole: str) -> tuple[str, str]:
    """The first error's dotted field path (``whole`` when it concerns the whole input) and message."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or whole
    return where, str(first["msg"])
