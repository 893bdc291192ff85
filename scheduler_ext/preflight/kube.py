"""The extender's ``GpuPreflight`` objects: one per member node of a gang, created for the book
(``PreflightPort``), watched for the node agents' answers, deleted once the gang is done with them.

Writes go through one worker thread, so a filter that asks for a preflight returns at once; a
write the API refuses is logged and the request then times out in the book (the gang goes
elsewhere). At start every object an earlier extender left behind (label
``app.kubernetes.io/managed-by=gpuweave-extender``) is deleted: the gangs that asked for them were
planned by that process and are planned again here.

The status is written by the node agent of ``spec.nodeName`` (RBAC: ``gpupreflights/status`` is
the agent's alone); it is read with ``devicemodel.preflight.read_status``, and one that does not
validate counts as a refusal.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from devicemodel.contracts import API_GROUP, API_VERSION, PREFLIGHT_PLURAL
from devicemodel.errors import InvalidInputError
from devicemodel.preflight import MANAGED_BY, Checks, PreflightSpec, preflight_object, read_spec, read_status
from kubeio.errors import NOT_FOUND, describe, status_of
from kubeio.listwatch import ListWatch
from scheduler_ext.preflight.book import Phase, PreflightBook, PreflightRequest

LOG = logging.getLogger(__name__)
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
MAX_QUEUED = 4096


class KubePreflights:
    """``PreflightPort`` over the API server; ``book`` is set once the book exists (it needs a port)."""

    def __init__(self, api: client.ApiClient, *, checks: Checks = "bandwidth") -> None:
        self._custom = client.CustomObjectsApi(api)
        self._checks = checks
        self.book: PreflightBook | None = None
        self._writes: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=MAX_QUEUED)
        self._halt = threading.Event()
        self._worker = threading.Thread(target=self._work, name="gpuweave-preflight-writes", daemon=True)
        self.watch = ListWatch(
            self._list, on_event=self._on_event, what="gpupreflights", label_selector=SELECTOR
        )

    def _list(self, **kwargs: Any) -> Any:
        return self._custom.list_cluster_custom_object(API_GROUP, API_VERSION, PREFLIGHT_PLURAL, **kwargs)

    def start(self) -> None:
        self._writes.put(("sweep", None))
        self._worker.start()
        self.watch.start()

    def stop(self) -> None:
        self._halt.set()
        self._queue("stop", None)  # wakes the worker
        self.watch.stop(join_s=1)
        self._worker.join(timeout=2)

    # ---- PreflightPort ------------------------------------------------------------------------
    def create(self, request: PreflightRequest) -> None:
        self._queue("create", request)

    def delete(self, name: str) -> None:
        self._queue("delete", name)

    def _queue(self, what: str, item: Any) -> None:
        try:
            self._writes.put_nowait((what, item))
        except queue.Full:
            LOG.error("preflight writes queue full (%d): dropping a %s; it times out", MAX_QUEUED, what)

    def _work(self) -> None:
        while not self._halt.is_set():
            what, item = self._writes.get()
            try:
                if what == "create":
                    self._create(item)
                elif what == "delete":
                    self._delete(item)
                elif what == "sweep":
                    self._sweep()
            except (ApiException, HTTPError) as exc:
                LOG.warning("GpuPreflight %s failed: %s", what, describe(exc))
            except Exception:  # a bug must not end the worker
                LOG.exception("GpuPreflight %s failed", what)

    def _create(self, request: PreflightRequest) -> None:
        spec = PreflightSpec(
            nodeName=request.node, gpus=list(request.gpus), checks=self._checks, requester=request.requester
        )
        body = preflight_object(request.name, spec)
        self._custom.create_cluster_custom_object(API_GROUP, API_VERSION, PREFLIGHT_PLURAL, body)
        what = f"{len(request.gpus)} GPU(s) for {request.requester}"
        LOG.info("asked node %s for a preflight of %s", request.node, what)

    def _delete(self, name: str) -> None:
        try:
            self._custom.delete_cluster_custom_object(API_GROUP, API_VERSION, PREFLIGHT_PLURAL, name)
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:
                raise

    def _sweep(self) -> None:
        listed: Any = self._custom.list_cluster_custom_object(
            API_GROUP, API_VERSION, PREFLIGHT_PLURAL, label_selector=SELECTOR
        )
        for item in listed.get("items") or []:
            self._delete(str((item.get("metadata") or {}).get("name") or ""))

    # ---- answers ------------------------------------------------------------------------------
    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED" or self.book is None:
            return
        name = str((obj.get("metadata") or {}).get("name") or "")
        try:
            read_spec(obj)
            status = read_status(obj)
        except InvalidInputError as exc:
            LOG.warning("GpuPreflight %s: %s; counted as refused", name, exc)
            self.book.result(name, Phase.REFUSED, str(exc))
            return
        if status is None:
            return
        passed = [uuid for uuid, gpu in status.gpus.items() if gpu.verdict == "passed"]
        self.book.result(name, Phase(status.phase), status.message, passed_gpus=passed)
