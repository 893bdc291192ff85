"""List, then watch, one kind of Kubernetes object: the only watch loop in gpuweave.

The loop lists once (remembering the list's resourceVersion), then watches from the last
resourceVersion it saw, with bookmarks, so a watch that times out or breaks resumes where it left
off without listing again. Only 410 Gone (the events since that version were compacted away)
makes it list again; the new list is compared with what it knew, and every object that vanished
meanwhile is handed on as a synthesised DELETED, so a delete missed while disconnected cannot
leave a phantom behind. Objects stay raw JSON (``dict``): decoding a watch event costs one
``orjson.loads`` per line, no model classes. Failures are retried after a bounded, jittered
back-off. ``synced`` is set once the first list has been handed on (a readiness signal).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from kubeio.backoff import Backoff
from kubeio.errors import GONE, KubeApiError, WatchExpiredError, describe, is_transport_failure, status_of

LOG = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 60  # the server ends each watch request after this long; it is re-opened from there
CONNECT_TIMEOUT_S = 10.0
READ_GRACE_S = 30.0  # a watch silent this long past its timeout is a dead connection

Object = dict[str, Any]
EventHandler = Callable[[str, Object], None]  # (ADDED | MODIFIED | DELETED, object)


def object_key(obj: Mapping[str, Any]) -> str:
    """The UID, else namespace/name: a re-created object with the same name is another object."""
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}")


def metadata_only(obj: Mapping[str, Any]) -> Object:
    """What a synthesised DELETED needs of an object (its identity, labels and annotations),
    without spec, status or managedFields: a watcher of 15,000 inventories keeps kilobytes per
    object instead of the whole decoded document."""
    metadata = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: v for k, v in metadata.items() if k != "managedFields"},
    }


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch response, as they arrive."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


class ListWatch:
    """Mirror one kind through ``on_event`` until ``stop``; ``run`` blocks, ``start`` runs it in a thread.

    ``list_call`` is a kubernetes client list function (``CoreV1Api.list_node``, a bound
    ``list_cluster_custom_object``); ``selectors`` (``field_selector=...``) go to every call.
    ``remember`` is what the loop keeps of each object for a synthesised DELETED (the whole
    object by default; ``metadata_only`` when the handler needs only who was deleted)."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        *,
        on_event: EventHandler,
        what: str,
        timeout_s: int = WATCH_TIMEOUT_S,
        key: Callable[[Mapping[str, Any]], str] = object_key,
        on_synced: Callable[[], None] = lambda: None,
        backoff: Backoff | None = None,
        remember: Callable[[Object], Object] = lambda obj: obj,
        **selectors: str,
    ) -> None:
        self._list = list_call
        self._on_event = on_event
        self.what = what
        self._timeout_s = timeout_s
        self._key = key
        self._on_synced = on_synced
        self._backoff = backoff or Backoff()
        self._remember = remember
        self._selectors = selectors
        self._halt = threading.Event()
        self._known: dict[str, Object] = {}
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.resource_version = ""  # the last version seen: a list's, an event's or a bookmark's
        self.relists = 0
        self.watches = 0
        self.bookmarks = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"gpuweave-watch-{self.what}", daemon=True)
        self._thread.start()

    def stop(self, *, join_s: float = 10.0) -> None:
        """End the loop now: the open watch connection is shut, not left to its timeout."""
        self._halt.set()
        response = self._response
        if response is not None:
            _interrupt(response)
            _shut(response)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=join_s)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                if not self.resource_version:
                    self._relist()
                self._follow()
            except WatchExpiredError:
                LOG.info(
                    "watch of %s expired at resourceVersion %s; listing again",
                    self.what,
                    self.resource_version,
                )
                self.resource_version = ""
            except Exception as exc:  # network, HTTP 5xx, a bad line: retry from the same version
                self._pause(exc)

    def _pause(self, exc: Exception) -> None:
        if self._halt.is_set():
            return
        delay = self._backoff.next()
        if not is_transport_failure(exc):
            LOG.error("watch of %s failed unexpectedly; retrying in %.1f s", self.what, delay, exc_info=exc)
        else:
            LOG.warning("watch of %s broke (%s); retrying in %.1f s", self.what, describe(exc), delay)
        self._halt.wait(delay)

    def _relist(self) -> None:
        response = self._call(_preload_content=False)
        body = orjson.loads(response.data)
        items: list[Object] = body.get("items") or []
        fresh = {self._key(item): item for item in items}
        for key, old in self._known.items():
            if key not in fresh:
                self._on_event("DELETED", old)  # vanished while we were not watching
        for key, item in fresh.items():
            self._on_event("MODIFIED" if key in self._known else "ADDED", item)
        self._known = {key: self._remember(item) for key, item in fresh.items()}
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self.relists += 1
        self._backoff.reset()
        if not self.synced.is_set():
            self.synced.set()
            self._on_synced()

    def _call(self, **kwargs: Any) -> Any:
        """``list_call`` with the selectors; 410 Gone from the call itself means the same as in a stream."""
        try:
            return self._list(**kwargs, **self._selectors)
        except Exception as exc:
            if status_of(exc) == GONE:
                raise WatchExpiredError(f"listing {self.what}: 410 Gone", status=GONE) from None
            raise

    def _follow(self) -> None:
        """Apply events until the server ends this watch request (its timeout) or ``stop``."""
        self._response = response = self._call(
            watch=True,
            resource_version=self.resource_version,
            timeout_seconds=self._timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, self._timeout_s + READ_GRACE_S),
        )
        self.watches += 1
        try:
            if self._halt.is_set():  # stop() ran before this response existed
                return
            for line in _lines(response):
                self._apply(orjson.loads(line))
                if self._halt.is_set():
                    return
            self._backoff.reset()
        except Exception:
            if self._halt.is_set():  # stop() shut the connection under the reader
                return
            raise
        finally:
            self._response = None
            _shut(response)

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = str(event.get("type")), event.get("object")
        if not isinstance(obj, dict):
            raise KubeApiError(f"watch of {self.what} sent an event without an object: {kind}", status=None)
        if kind == "ERROR":
            code = obj.get("code")
            error = WatchExpiredError if code == GONE else KubeApiError
            raise error(f"watch of {self.what}: {obj.get('message') or obj}", status=code)
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            self.bookmarks += 1
            return
        key = self._key(obj)
        if kind == "DELETED":
            self._known.pop(key, None)
        else:
            self._known[key] = self._remember(obj)
        self._on_event(kind, obj)


def _interrupt(response: Any) -> None:
    """Wake the reader blocked on the watch's socket. Closing the response alone would wait for
    the lock the reader holds while it waits for data, so until the server sent something or
    ended the watch (up to its timeout); a socket shut down for both directions returns from
    that wait at once."""
    sock = getattr(getattr(response, "connection", None), "sock", None)  # kept while the body is unread
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as exc:  # the server or the reader closed it first
        LOG.debug("shutting a watch socket: %s", exc)


def _shut(response: Any) -> None:
    try:
        response.close()
        response.release_conn()
    except Exception as exc:  # already closed by the other thread: nothing left to free
        LOG.debug("closing a watch response: %s", exc)
