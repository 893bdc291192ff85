"""The one error tree of gpuweave.

Every error we raise on purpose derives from ``GpuweaveError``. Messages name the object, the
numbers involved and the next step, so the CLI prints them as one line with no traceback.
"""

from __future__ import annotations

from devicemodel.text import safe_text


class GpuweaveError(Exception):
    """Base of every error gpuweave raises on purpose."""


class InvalidInputError(GpuweaveError):
    """Input from a user, a file or a peer failed validation."""


class AllocationRejectedError(InvalidInputError):
    """A kubelet request names devices or sizes we cannot honour (gRPC INVALID_ARGUMENT); raised
    by the resource kinds (``devicekinds``) and the device plugin alike."""


class TopologyError(GpuweaveError):
    """A topology query cannot be answered for the given inventory."""


ECHO_CHARS = 200  # of a piece of input quoted in a message: enough to recognise it
MAX_REASON_CHARS = 512  # of one reason or message built around input (a filter answer has one per node)


def echo(value: object, *, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters of the value and saying how long
    it was: a hostile annotation of 250 KiB must not be repeated into every node's rejection reason."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(value)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def clip(text: str, *, limit: int = MAX_REASON_CHARS) -> str:
    """A message that may carry input, as ``devicemodel.text.safe_text`` writes it: control and
    format characters escaped, at most ``limit`` characters, a cut marked."""
    return safe_text(text, limit=limit)
