"""The node agent's side of gang preflights: it watches the ``GpuPreflight`` objects that name its
node, runs each one's check and writes its status (``health.preflight`` says what is run and what
the status says).

- **Who may write what.** The extender creates the objects (its RBAC: create, get, list, watch,
  delete; ``manifests/rbac-extender.yaml``); only node agents may write their status (RBAC:
  ``gpupreflights/status`` patch), and an agent writes only the objects whose ``spec.nodeName``
  is its node: it lists and watches with the field selector ``spec.nodeName=<node>`` (a selectable
  field of the CRD), and checks the spec again before it runs anything.
- **Bounded cost.** One object is run at a time, by one worker (after any active check already
  running: the runner runs one at a time); at most ``MAX_QUEUED`` wait, the rest are refused. An
  object is run once: one that already has a status is left alone. The spec is validated
  (``devicemodel.preflight``: at most 64 GPUs, level 1 or 2) and a bad one is refused with why.
- **Served.** Once its first list is in, the agent labels its Node ``gpuweave.io/preflight=agent``:
  the extender asks only nodes whose agent serves preflights (an older agent never would).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from devicemodel.contracts import API_GROUP, API_VERSION, LABEL_PREFLIGHT, PREFLIGHT_PLURAL
from devicemodel.errors import InvalidInputError
from devicemodel.inventory import NodeInventory
from devicemodel.preflight import PreflightStatus, read_spec, status_body
from health.active_runner import ActiveCheckRunner
from health.errors import ActiveCheckBusyError
from health.preflight import TRIGGER, checks_of, indexes_of, refused, status_for, summary
from kubeio.errors import describe
from kubeio.listwatch import ListWatch

log = logging.getLogger(__name__)
MAX_QUEUED = 64
BUSY_WAIT_S = 600.0  # how long a preflight waits for a check already running to end
BUSY_POLL_S = 0.5


class PreflightServer:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        node: str,
        runner: ActiveCheckRunner,
        inventory: Callable[[], NodeInventory],
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self.node, self.runner, self.inventory = node, runner, inventory
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=MAX_QUEUED)
        self._taken: set[str] = set()  # UIDs queued or run (an object is run once)
        self._halt = threading.Event()
        self._worker = threading.Thread(target=self._work, name="gpuweave-preflights", daemon=True)
        self.watch = ListWatch(
            self._list,
            on_event=self._on_event,
            on_synced=self._label_node,
            what="gpupreflights",
            field_selector=f"spec.nodeName={node}",
        )

    def _list(self, **kwargs: Any) -> Any:
        return self._custom.list_cluster_custom_object(API_GROUP, API_VERSION, PREFLIGHT_PLURAL, **kwargs)

    def start(self) -> None:
        self._worker.start()
        self.watch.start()

    def stop(self) -> None:
        self._halt.set()
        self.watch.stop(join_s=1)
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._worker.join(timeout=2)

    def _label_node(self) -> None:
        try:
            self._core.patch_node(self.node, {"metadata": {"labels": {LABEL_PREFLIGHT: "agent"}}})
        except (ApiException, HTTPError) as exc:
            log.warning(
                "cannot label node %s %s=agent (%s): no gang preflight is asked of it",
                self.node,
                LABEL_PREFLIGHT,
                describe(exc),
            )

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid") or metadata.get("name") or "")
        if kind == "DELETED" or obj.get("status") or uid in self._taken:
            return
        try:
            self._queue.put_nowait(dict(obj))
        except queue.Full:
            self._write(
                str(metadata.get("name") or ""), refused(f"{MAX_QUEUED} preflights already wait on this node")
            )
            return
        self._taken.add(uid)

    def _work(self) -> None:
        while not self._halt.is_set():
            obj = self._queue.get()
            if obj is None:
                return
            try:
                self._serve(obj)
            except Exception:  # a bug must not end the worker
                log.exception("gang preflight failed")

    def _serve(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        try:
            spec = read_spec(obj)
            if spec.node_name != self.node:
                raise InvalidInputError(f"it names node {spec.node_name}, not {self.node}")
            indexes = indexes_of(spec, self.inventory())
        except InvalidInputError as exc:
            self._write(name, refused(str(exc)))
            return
        self._write(name, PreflightStatus(phase="Running", message="checking the GPUs"))
        outcome = self._run(indexes, level=spec.level, checks=checks_of(spec))
        status = status_for(outcome) if outcome is not None else refused("another active check kept running")
        log.log(
            logging.WARNING if status.phase != "Passed" else logging.INFO,
            "gang preflight %s for %s: %s %s",
            name,
            spec.requester or "?",
            status.phase,
            dict(summary(status)),
        )
        self._write(name, status)

    def _run(self, indexes: list[int] | None, *, level: int, checks: Any) -> Any:
        """The run's outcome, after waiting for a run already going (None: it did not end in time)."""
        until = time.monotonic() + BUSY_WAIT_S
        while not self._halt.is_set():
            try:
                return self.runner.run(indexes, level=level, trigger=TRIGGER, checks=checks)
            except ActiveCheckBusyError:
                if time.monotonic() > until:
                    return None
                self._halt.wait(BUSY_POLL_S)
        return None

    def _write(self, name: str, status: PreflightStatus) -> None:
        body = {"status": status_body(status)}
        try:
            self._custom.patch_cluster_custom_object_status(
                API_GROUP, API_VERSION, PREFLIGHT_PLURAL, name, body
            )
        except (ApiException, HTTPError) as exc:
            log.warning("cannot write the status of GpuPreflight %s: %s", name, describe(exc))
