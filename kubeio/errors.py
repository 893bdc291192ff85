"""The one place that turns a failed API call into something gpuweave can act on.

The kubernetes client raises ``ApiException`` (an HTTP status), urllib3 raises ``HTTPError``
(no answer at all), sockets raise ``OSError``. Callers need three answers from that: is it 410
Gone (list again), a lost race (404/409: someone else won, not an error), or a failure to log
and retry. The few other statuses a caller acts on (404 alone: nothing there yet; 429: an
eviction a PodDisruptionBudget refused) are named here too, so each lives in one place. This
module reads the status by attribute, so importing it does not load the kubernetes client
(agents without an API server stay small).
"""

from __future__ import annotations

import json

from urllib3.exceptions import HTTPError

from devicemodel.errors import GpuweaveError, clip

NOT_FOUND = 404
CONFLICT = 409
GONE = 410
TOO_MANY_REQUESTS = 429
LOST_RACE = frozenset({NOT_FOUND, CONFLICT})
MAX_STATUS_BODY = 64 * 1024  # an answer's body read for its message, at most
MAX_MESSAGE_CHARS = 400  # of the server's message, in a log line


class KubeApiError(GpuweaveError):
    """An API server call failed; ``status`` is the HTTP status, None when no answer came."""

    def __init__(self, message: str, *, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class WatchExpiredError(KubeApiError):
    """410 Gone: the events since the watch's resourceVersion are compacted away; list again."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an ``ApiException`` (or our own error), None for transport failures."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def describe(exc: BaseException) -> str:
    """``HTTP 409 Conflict`` for an answer from the server, with the message of the Status it
    answered when there is one (``HTTP 422 Unprocessable Entity: ... denied request: ...``: an
    admission policy's or a validation's reason); the exception's text otherwise."""
    status = status_of(exc)
    if status is not None and not isinstance(exc, KubeApiError):
        head = f"HTTP {status} {getattr(exc, 'reason', '') or ''}".rstrip()
        message = server_message(exc)
        return f"{head}: {message}" if message else head
    return str(exc) or type(exc).__name__


def server_message(exc: BaseException) -> str:
    """The ``message`` of the Status object in an ``ApiException``'s body ('' when none), cut to
    ``MAX_MESSAGE_CHARS`` with control characters replaced: it can repeat what a request carried."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body[:MAX_STATUS_BODY].decode("utf-8", "replace")
    if not isinstance(body, str) or len(body) > MAX_STATUS_BODY or not body.lstrip().startswith("{"):
        return ""
    try:
        answer = json.loads(body)
    except ValueError:
        return ""
    message = answer.get("message") if isinstance(answer, dict) else None
    if not isinstance(message, str):
        return ""
    return clip("".join(c if c.isprintable() else " " for c in message), limit=MAX_MESSAGE_CHARS)


def is_transport_failure(exc: BaseException) -> bool:
    """A failure the next attempt may not see: an HTTP answer, a dropped connection, a bad body."""
    return status_of(exc) is not None or isinstance(exc, HTTPError | OSError | ValueError)


def api_error(exc: BaseException, *, doing: str, hint: str = "") -> KubeApiError:
    """``KubeApiError("<doing> failed: HTTP 403 Forbidden; <hint>")`` keeping the status."""
    status = status_of(exc)
    kind = WatchExpiredError if status == GONE else KubeApiError
    tail = f"; {hint}" if hint else ""
    return kind(f"{doing} failed: {describe(exc)}{tail}", status=status)
