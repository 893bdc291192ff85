"""The head of an HTTP/1.x request (request line and header fields), read without the ``email``
package.

The standard library's request handler parses every request's header fields with
``email.parser``, a general MIME parser: for the three small requests kube-scheduler sends per pod
(filter, prioritize, bind) that was 12% of the extender's CPU in a profiled end-to-end run
(docs/e2e.md). This reads the fields with
``readline`` and ``str`` methods under the same limits the standard library applies (a line of at
most 65,536 bytes, at most 100 fields), and is stricter where leniency invites request smuggling:
an obsolete folded line, a field without a colon or with whitespace before it, and two different
``Content-Length`` values are refused. The body is framed by ``Content-Length`` alone
(``body_length``): any ``Transfer-Encoding`` is refused, and so is a length that is not ASCII
digits, on every route.
"""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
from typing import Protocol, overload

MAX_LINE = 65536  # bytes in one field line (http.client's _MAXLINE)
MAX_FIELDS = 100  # field lines in one head (http.client's _MAXHEADERS)
_SINGLE = ("content-length", "transfer-encoding")  # a second, different value is refused
MAX_LENGTH_DIGITS = 18  # significant digits of a Content-Length: past any body (int() stops at 4,300)


class LineReader(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


class HeadError(Exception):
    """A head that is not answered with a request: ``status`` and a one-line ``reason``."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class RequestHeaders:
    """Field name -> value, names compared without case; a repeated field keeps its first value
    (``Connection``, ``Expect`` and the body's framing are all the handler reads)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields  # keys in lower case

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...
    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


def request_version(version: str) -> tuple[int, int]:
    """``HTTP/x.y`` as (x, y); raises ``HeadError`` (400) for anything else."""
    if version == "HTTP/1.1":  # every request kube-scheduler sends
        return 1, 1
    major, dot, minor = version.removeprefix("HTTP/").partition(".")
    if (
        not version.startswith("HTTP/")
        or not dot
        or not (major.isdigit() and minor.isdigit())
        or max(len(major), len(minor)) > 10
        or not (major.isascii() and minor.isascii())
    ):
        raise HeadError(HTTPStatus.BAD_REQUEST, f"bad request version {version!r}")
    return int(major), int(minor)


def read_headers(rfile: LineReader) -> RequestHeaders:
    """The field lines up to the empty line that ends the head."""
    fields: dict[str, str] = {}
    for _ in range(MAX_FIELDS + 1):
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise HeadError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header line too long")
        if line in (b"\r\n", b"\n", b""):
            return RequestHeaders(fields)
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t"):
            raise HeadError(HTTPStatus.BAD_REQUEST, "folded header lines are not accepted")
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.rstrip(" \t"):
            raise HeadError(HTTPStatus.BAD_REQUEST, f"malformed header line {text[:80]!r}")
        key, value = name.lower(), value.strip(" \t")
        previous = fields.setdefault(key, value)
        if previous != value and key in _SINGLE:
            raise HeadError(HTTPStatus.BAD_REQUEST, f"conflicting {name} headers")
    raise HeadError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_FIELDS} header lines")


def body_length(headers: RequestHeaders) -> int | None:
    """The body's length from ``Content-Length`` (None when there is none); raises ``HeadError``
    (400) for any ``Transfer-Encoding`` (kube-scheduler's client sends a ``Content-Length`` for
    its byte bodies: chunked framing here would only be a second reading of where a request ends)
    and for a value that is not 1*DIGIT (``+12``, ``1_2``, ``0x0c``, non-ASCII digits, empty: all of
    which ``int()`` would partly take) or has more than ``MAX_LENGTH_DIGITS`` significant digits."""
    if "transfer-encoding" in headers:
        raise HeadError(
            HTTPStatus.BAD_REQUEST,
            "Transfer-Encoding is not accepted (chunked or any other); "
            "send the body with Content-Length only",
        )
    raw = headers.get("content-length")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise HeadError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {raw[:40]!r}: ASCII digits only")
    significant = raw.lstrip("0") or "0"
    if len(significant) > MAX_LENGTH_DIGITS:
        raise HeadError(
            HTTPStatus.BAD_REQUEST,
            f"Content-Length of {len(significant)} digits; at most {MAX_LENGTH_DIGITS} are read",
        )
    return int(significant)
