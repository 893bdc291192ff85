"""Text that leaves a gpuweave process: escaped and clipped, whatever a pod put in it.

A pod's author writes annotations, labels, a CEL selector, even the message kube-scheduler
repeats on the pod; that text reaches filter reasons (kube-scheduler copies them into its
FailedScheduling Event), our own Events, our logs and ``gpuweave status`` on an operator's
terminal. Two things in it do harm there: control characters (an escape sequence rewrites a
terminal, a newline forges a log line) and Unicode format characters (a right-to-left override
makes ``gpu-a`` read as another name). And its length is the author's choice: 1 MB of
annotation must not become 1 MB per node in an answer or a screen.

``safe_text`` is the one rule for all of them. Every character of Unicode category Cc (C0, DEL,
C1), Cf (bidi embeddings, overrides and isolates, U+200E/F, U+061C, zero-width characters), Cs
(a lone surrogate, which no UTF-8 writer takes), Zl and Zp (line and paragraph separators) is
written as its escape, visible and in ASCII: ``\\x1b``, ``\\n``, ``\\u202e``, ``\\U000e0001``.
Nothing is dropped, so an operator sees that something was there. The result is at most
``limit`` characters: a longer text is cut at a whole escape and ends with a marker that says
how many of how many characters were cut. Backslashes are not doubled: the result stays readable
and ``safe_text`` of its own result changes nothing.

Apply it where text leaves (an answer, an Event, a log line, a terminal), once, with that
boundary's limit. Pure.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import Any, Final

ESCAPED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
MAX_LOG_CHARS: Final = 4096  # of one log message (a traceback is added after, in full)
MAX_EVENT_CHARS: Final = 1024  # of an Event's message (events.k8s.io's own limit for a note)
MAX_SHOWN_CHARS: Final = 2048  # of one field a terminal shows (`gpuweave status`)
MAX_JSON_CHARS: Final = 16384  # of one string in JSON output (JSON escapes; only length is bounded)
_SHORT: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(char: str) -> str:
    if unicodedata.category(char) not in ESCAPED_CATEGORIES:
        return char
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """``text`` with every control, format and separator character escaped (no clipping)."""
    if text.isprintable():  # C-level: no character of the escaped categories is printable
        return text
    return "".join(map(_escape, text))


def _marker(cut: int, total: int) -> str:
    return f"... (cut {cut} of {total} characters)"


def clip_text(text: str, *, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters with the marker, nothing escaped: for JSON,
    whose encoder escapes every control character itself."""
    if len(text) <= limit:
        return text
    kept = max(0, limit - len(_marker(len(text), len(text))))
    return text[:kept] + _marker(len(text) - kept, len(text))


def safe_text(text: str, *, limit: int) -> str:
    """``text`` escaped (``escape_controls``) and at most ``limit`` characters, a cut marked.

    Only the first ``limit`` characters are ever escaped: each one yields at least one character,
    so a 1 MB text costs what ``limit`` characters cost."""
    if len(text) <= limit and text.isprintable():
        return text
    head = text[:limit]
    pieces = list(head) if head.isprintable() else [_escape(c) for c in head]
    if len(text) <= limit and sum(map(len, pieces)) <= limit:
        return "".join(pieces)
    budget = limit - len(_marker(len(text), len(text)))
    kept, used = 0, 0
    for piece in pieces:
        if used + len(piece) > budget:
            break
        kept, used = kept + 1, used + len(piece)
    return "".join(pieces[:kept]) + _marker(len(text) - kept, len(text))


class EscapingFormatter(logging.Formatter):
    """A log formatter that writes each record's message through ``safe_text``: one line per
    record whatever a pod's name, annotation or selector put into it. A traceback keeps its
    lines, each escaped and clipped the same way (its last line quotes the exception's message,
    which may quote input)."""

    def __init__(self, fmt: str | None = None, *, limit: int = MAX_LOG_CHARS) -> None:
        super().__init__(fmt)
        self._limit = limit

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        escaped = logging.makeLogRecord(record.__dict__)
        escaped.message = safe_text(record.message, limit=self._limit)
        return super().formatMessage(escaped)

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return self._lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 (logging's name)
        return self._lines(super().formatStack(stack_info))

    def _lines(self, text: str) -> str:
        return "\n".join(safe_text(line, limit=self._limit) for line in text.split("\n"))
