"""List, then watch, one kind of Kubernetes object, with relist on 410 Gone.

One loop for every watch of the node agent (its own pods for the handoff, its Node for the MIG
layout, pending pods for MIG demand): resume from the last resourceVersion after a watch timeout,
list again only when the server says the version expired, and end at once on ``stop``.
The kubernetes client is imported inside, so an agent without an API server never loads it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

LOG = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 60  # a watch request ends after this long and is re-opened from the last version
RETRY_S = 5.0  # after a failed list or watch


class ListWatch:
    """List, then watch from the list's resourceVersion, until ``stop``: relist on 410 Gone, retry
    other failures after ``RETRY_S``. ``run`` blocks its caller's thread; ``stop`` (from another
    thread) also shuts the open watch connection so it ends at once, not at the watch timeout."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        *,
        on_list: Callable[[Sequence[Any]], None],
        on_event: Callable[[str, Any], None],
        what: str,
        timeout_s: int = WATCH_TIMEOUT_S,
        **selectors: str,
    ) -> None:
        self._list = list_call
        self._on_list = on_list
        self._on_event = on_event
        self._what = what
        self._timeout_s = timeout_s
        self._selectors = selectors
        self._stop = threading.Event()
        self._watch: Any = None

    def stop(self) -> None:
        self._stop.set()
        current = self._watch
        if current is not None:
            current.stop()

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 (only with an API server)

        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except ApiException as exc:
                if exc.status == 410:
                    LOG.info("watch of %s expired (410 Gone); listing again", self._what)
                    continue
                LOG.warning("watch of %s failed: HTTP %s %s; retrying", self._what, exc.status, exc.reason)
                self._stop.wait(RETRY_S)
            except Exception as exc:  # connection refused or reset, a bad response: retry
                if not self._stop.is_set():
                    LOG.warning("watch of %s failed: %s; retrying", self._what, exc)
                self._stop.wait(RETRY_S)

    def _list_and_watch(self) -> None:
        from kubernetes import watch as kube_watch  # noqa: PLC0415 (only with an API server)

        listed = self._list(**self._selectors)
        self._on_list(listed.items or [])
        version = listed.metadata.resource_version
        while not self._stop.is_set():
            self._watch = watcher = kube_watch.Watch()  # type: ignore[no-untyped-call]
            if self._stop.is_set():  # stop() ran before this watch existed
                return
            for event in watcher.stream(  # type: ignore[no-untyped-call]
                self._list, resource_version=version, timeout_seconds=self._timeout_s, **self._selectors
            ):
                version = watcher.resource_version
                self._on_event(str(event["type"]), event["object"])
                if self._stop.is_set():
                    return
            version = watcher.resource_version or version
