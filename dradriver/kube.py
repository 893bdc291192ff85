"""The DRA driver's API-server side: reading claims at prepare, publishing the node's pool, IMEX domains.

``KubeClaimSource`` reads a ResourceClaim as JSON (camelCase, as the API server sends it).
``KubeImexDomains`` writes this node's entry of a GpuImexDomain's status and follows the object
(``dradriver.imex_domains``).
``SlicePublisher`` keeps this node's ResourceSlices of driver ``gpuweave.io`` equal to what the
builder gives: it lists the slices it finds for the node and driver, and when the devices, counters
or taints differ it writes the whole pool again under the next generation (create or replace by
name) and deletes slices the pool no longer has; nothing changes, nothing is written. It runs in a
background thread, coalesces bursts, lists the pool from the API server at least every
``RESYNC_S`` seconds (the kubelet deletes a driver's slices when it loses the plugin's registration),
counted by the clock so that the health rounds' frequent wakes never postpone it, and retries
through an outage, never blocking the kubelet's gRPC path. A taint that stays keeps the
``timeAdded`` the API server stamped (``taints.carry_time_added``), so republishing never
restarts a NoExecute toleration.

A wake from ``changed()`` (every health round calls it) compares the new build with the slices
as this process last read or wrote them, without a LIST: only the periodic resync, ``resync()``
(the kubelet accepted the registration: it may have wiped the pool) and the first reconcile after
a failure list from the API server. A (re)started kubelet wipes the node's slices in the
background after it starts, so it can delete a pool published right after the registration:
``resync()`` lists now and once more ``AFTER_REGISTRATION_S`` later. A slice gone under a
replace (404) is created again at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dradriver.api_fields import ServedFields, SliceFeature, without_fields
from dradriver.devices import DRIVER
from dradriver.imex_domain import (
    GROUP,
    PLURAL,
    VERSION,
    DomainNode,
    DomainRef,
    ImexDomainError,
    domain_status,
    joined,
    left,
    only_own_entry_changed,
    status_patch,
)
from dradriver.imex_domains import StopWatch
from dradriver.prepare import ClaimError
from kubeio.client import finish
from kubeio.errors import CONFLICT, NOT_FOUND, describe, status_of
from kubeio.listwatch import ListWatch

log = logging.getLogger(__name__)

RETRY_S = 5.0
RESYNC_S = 30.0  # a LIST at least this often: the kubelet wipes a driver's slices when it
# loses the plugin's registration (its own restart included), and nothing else would tell us
AFTER_REGISTRATION_S = 5.0  # the second LIST after a registration: the kubelet's start-up wipe is async
# generation, the taints already published (device name -> wire taints) -> the pool's slices
PoolBuilder = Callable[[int, Mapping[str, list[Mapping[str, str]]]], list[dict[str, Any]]]


class KubeClaimSource:
    """``ClaimSource`` over the API server (needs ``resourceclaims get``)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._resource = client.ResourceV1Api(api)

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            raw = self._resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:
                raise ClaimError(f"ResourceClaim {namespace}/{name} not found") from None
            raise ClaimError(f"cannot read ResourceClaim {namespace}/{name}: {describe(exc)}") from None
        except Exception as exc:  # API server unreachable: the kubelet retries the claim
            raise ClaimError(f"cannot read ResourceClaim {namespace}/{name}: {exc}") from None
        data: Mapping[str, Any] = json.loads(finish(raw))
        return data


def _comparable(
    spec: Mapping[str, Any], unsupported: frozenset[SliceFeature] = frozenset()
) -> dict[str, Any]:
    """A slice's content without what the API server adds or the generation counts, nor the
    fields it drops (``unsupported``), so a pool it keeps without them is not written again."""
    spec = without_fields(spec, unsupported)
    devices = []
    for device in spec.get("devices") or []:
        taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in device.get("taints") or []]
        devices.append(
            {**device, "taints": taints} if taints else {k: v for k, v in device.items() if k != "taints"}
        )
    return {"devices": devices, "sharedCounters": spec.get("sharedCounters") or []}


def published_taints(slices: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, str]]]:
    return {
        d["name"]: list(d["taints"])
        for s in slices
        for d in s["spec"].get("devices") or []
        if d.get("taints")
    }


class SlicePublisher:
    """Writes this node's pool (see the module docstring); ``changed()`` wakes it."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        node: str,
        build: PoolBuilder,
        resync_s: float = RESYNC_S,
        clock: Callable[[], float] = time.monotonic,
        served: ServedFields | None = None,
    ) -> None:
        """``served``: what the API server keeps of a slice, learned from each write's answer and
        read by ``build`` (``dradriver.api_fields``)."""
        self._resource = client.ResourceV1Api(api)
        self.served = served or ServedFields()
        self._resync_s = resync_s
        self._clock = clock
        self._list_at = clock() + resync_s  # the next periodic LIST (the first reconcile lists anyway)
        self._second_list_at: float | None = None  # the LIST that follows a registration's
        self._lock = threading.Lock()
        self._node = node
        self._build = build
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dra-slices", daemon=True)
        self.published = 0  # pool generations written by this process
        self.listed = 0  # LISTs of the pool sent to the API server
        self._known: list[dict[str, Any]] | None = None  # the pool as last read or written
        self._relist = threading.Event()
        self._relist.set()

    def start(self) -> None:
        self._wake.set()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def changed(self) -> None:
        """The devices or their health may have changed: compare with the pool as last known."""
        self._wake.set()

    def resync(self) -> None:
        """The kubelet accepted the registration, so it may have wiped the pool, now or in a
        moment: list it before comparing, and list again ``AFTER_REGISTRATION_S`` later."""
        with self._lock:
            self._second_list_at = self._clock() + AFTER_REGISTRATION_S
        self._relist.set()
        self._wake.set()

    def _due_in(self) -> float:
        with self._lock:
            second = self._second_list_at
            due = self._list_at if second is None else min(self._list_at, second)
            return due - self._clock()

    def _take_due_list(self) -> bool:
        """True when a LIST is due now (the periodic one, or the one after a registration)."""
        with self._lock:
            now = self._clock()
            second = self._second_list_at is not None and self._second_list_at <= now
            if second:
                self._second_list_at = None
            return second or self._list_at <= now

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self._due_in()))
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._take_due_list():
                self._relist.set()  # however often changed() woke us in between
            try:
                self.publish_once(relist=self._relist.is_set())
            except Exception as exc:  # API outage: keep serving the kubelet, retry later
                log.warning("publishing ResourceSlices failed (%s); retrying in %.0f s", exc, RETRY_S)
                if self._stop.wait(RETRY_S):
                    return
                self.resync()

    def current(self) -> list[dict[str, Any]]:
        """This node's slices of our driver as the API server has them."""
        raw = self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={self._node},spec.driver={DRIVER}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(finish(raw)).get("items") or []
        self.listed += 1
        return items

    def publish_once(self, *, relist: bool = True) -> bool:
        """One reconcile; True when the pool was written. ``relist=False`` compares with the pool
        as this process last read or wrote it (no LIST) when it has one."""
        if relist or self._known is None:
            self._relist.clear()
            with self._lock:
                self._list_at = self._clock() + self._resync_s
            self._known = None
            existing = self.current()
            self._known = existing
        else:
            existing = self._known
        generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)
        desired = self._build(max(generation, 1), published_taints(existing))
        by_name = {s["metadata"]["name"]: s for s in existing}
        unsupported = self.served.unsupported
        same = set(by_name) == {s["metadata"]["name"] for s in desired} and all(
            _comparable(by_name[s["metadata"]["name"]]["spec"], unsupported)
            == _comparable(s["spec"], unsupported)
            and by_name[s["metadata"]["name"]]["spec"]["pool"] == s["spec"]["pool"]
            for s in desired
        )
        if same:
            return False
        desired = self._build(generation + 1, published_taints(existing))
        self._known = None  # until every write below went through
        written: list[dict[str, Any]] = []
        for item in desired:
            name = item["metadata"]["name"]
            if name in by_name:
                version = by_name[name]["metadata"]["resourceVersion"]
                body = {**item, "metadata": {**item["metadata"], "resourceVersion": version}}
                try:
                    raw = self._resource.replace_resource_slice(name, cast(Any, body), _preload_content=False)
                except ApiException as exc:
                    if status_of(exc) != NOT_FOUND:
                        raise
                    raw = self._resource.create_resource_slice(cast(Any, item), _preload_content=False)
            else:
                raw = self._resource.create_resource_slice(cast(Any, item), _preload_content=False)
            written.append(json.loads(finish(raw)))
        for name in by_name.keys() - {s["metadata"]["name"] for s in desired}:
            try:
                self._resource.delete_resource_slice(name)
            except ApiException as exc:
                if status_of(exc) != NOT_FOUND:
                    raise
        self._known = written
        self.published += 1
        log.info(
            "published %d ResourceSlices of pool %s, generation %d", len(desired), self._node, generation + 1
        )
        if self.served.learn(desired, written):
            self._wake.set()  # the API server dropped fields: publish the pool that needs none of them
        return True

    def delete_all(self) -> None:
        """Remove this node's pool (the agent leaves DRA mode, or the node goes)."""
        for item in self.current():
            try:
                self._resource.delete_resource_slice(item["metadata"]["name"])
            except ApiException as exc:
                if status_of(exc) != NOT_FOUND:
                    raise


MERGE_PATCH = "application/merge-patch+json"
WRITE_ATTEMPTS = 8  # of one status write that keeps losing to other nodes' writes (409 Conflict)
IMEX_RBAC_HINT = "the node agent needs gpuimexdomains get/list/watch and gpuimexdomains/status patch"


class KubeImexDomains:
    """``dradriver.imex_domains.DomainApi`` over the API server: this node's entry in a
    GpuImexDomain's ``status.nodes``, written as a merge patch preconditioned on the version it was
    read at (a 409 Conflict, another node's write in between, reads again), and nothing else: the
    entries of other nodes are checked unchanged before every write."""

    def __init__(self, api: client.ApiClient, *, attempts: int = WRITE_ATTEMPTS) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._attempts = attempts

    def address(self, node: str) -> str:
        try:
            found = self._core.read_node(node)
        except ApiException as exc:
            raise ImexDomainError(f"cannot read Node {node}: {describe(exc)}") from None
        addresses = (found.status.addresses or []) if found.status else []
        return next((a.address for a in addresses if a.type == "InternalIP"), "")

    def _read(self, ref: DomainRef) -> dict[str, Any] | None:
        try:
            raw = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, _preload_content=False
            )
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:
                return None
            problem = f"cannot read {ref.describe()}: {describe(exc)}; {IMEX_RBAC_HINT}"
            raise ImexDomainError(problem) from None
        found: dict[str, Any] = json.loads(finish(raw))
        return found

    def _edit(
        self,
        ref: DomainRef,
        node: str,
        change: Callable[[int, tuple[DomainNode, ...]], tuple[DomainNode, ...]],
        *,
        missing_ok: bool,
    ) -> None:
        for _ in range(self._attempts):
            found = self._read(ref)
            if found is None:
                if missing_ok:
                    return
                raise ImexDomainError(
                    f"{ref.describe()} not found: create it in the claim's namespace with the job's "
                    "spec.numNodes (docs/dra.md, The IMEX channel)"
                )
            num_nodes, entries = domain_status(found, ref=ref)
            wanted = change(num_nodes, entries)
            if wanted == entries:
                return
            if not only_own_entry_changed(entries, wanted, node=node):  # a bug here, never input
                raise ImexDomainError(f"{ref.describe()}: refusing a write that changes another node's entry")
            body = status_patch(wanted, resource_version=str(found["metadata"]["resourceVersion"]))
            try:
                self._custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ref.namespace, PLURAL, ref.name, body, _content_type=MERGE_PATCH
                )
                return
            except ApiException as exc:
                if status_of(exc) == CONFLICT:
                    continue  # another node wrote in between: read again
                if status_of(exc) == NOT_FOUND and missing_ok:
                    return
                raise ImexDomainError(
                    f"cannot write {ref.describe()}'s status: {describe(exc)}; {IMEX_RBAC_HINT}"
                ) from None
        raise ImexDomainError(
            f"{ref.describe()}: the status write lost to other nodes' writes {self._attempts} times in a row"
        )

    def join(self, ref: DomainRef, entry: DomainNode) -> None:
        self._edit(
            ref, entry.name, lambda num, entries: joined(entries, entry, num_nodes=num), missing_ok=False
        )

    def leave(self, ref: DomainRef, node: str) -> None:
        self._edit(ref, node, lambda _num, entries: left(entries, node), missing_ok=True)

    def watch(self, ref: DomainRef, on_object: Callable[[Mapping[str, Any] | None], None]) -> StopWatch:
        """A list-watch of the one object (field selector ``metadata.name``) in a thread."""
        seen = threading.Event()

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            seen.set()
            on_object(None if kind == "DELETED" else obj)

        def on_synced() -> None:
            if not seen.is_set():  # the first list found nothing: the domain is gone
                on_object(None)

        watch = ListWatch(
            partial(self._custom.list_namespaced_custom_object, GROUP, VERSION, ref.namespace, PLURAL),
            on_event=on_event,
            on_synced=on_synced,
            what=f"{PLURAL} {ref.namespace}/{ref.name}",
            field_selector=f"metadata.name={ref.name}",
        )
        watch.start()
        return watch.stop
