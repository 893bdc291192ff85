"""The one error tree of gpuweave.

Every error we raise on purpose derives from ``GpuweaveError``. Messages name the object, the
numbers involved and the next step, so the CLI prints them as one line with no traceback.
"""

from __future__ import annotations


class GpuweaveError(Exception):
    """Base of every error gpuweave raises on purpose."""


class InvalidInputError(GpuweaveError):
    """Input from a user, a file or a peer failed validation."""


class TopologyError(GpuweaveError):
    """A topology query cannot be answered for the given inventory."""
