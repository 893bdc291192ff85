"""NodePrepareResources / NodeUnprepareResources: what a claim's devices are and how they are handed out.

``ClaimPreparer`` is the kubelet-facing core of the DRA plugin, with no gRPC in it. Preparing a claim
reads the ResourceClaim from the API server (``ClaimSource``), takes its allocation results for driver
``gpuweave.io`` in this node's pool, maps each device name back to the device model
(``dradriver.devices``), writes the claim's CDI spec (``claim_cdi``) and returns the CDI
device IDs. Every prepared claim is checkpointed in ``STATE_DIR/dra-claims.json`` (replaced
atomically) before the answer goes back, so:

- prepare is idempotent: a claim already prepared (in this run or an earlier one) gets the same
  answer without reading the API server or writing anything;
- unprepare is idempotent: an unknown claim is already unprepared;
- an agent restart neither leaks nor double-prepares: the checkpoint is read at start, a spec file
  missing for a checkpointed claim is written again, and a spec file without a checkpoint entry
  (a crash between the two writes) is removed, since the kubelet was never told about it.

With ``--dra-mig dynamic`` (``mig``), an allocated MIG placement with no instance gets one before the
spec is written (``mig_demand``), recorded as pending first; a pending claim found at start (the agent
stopped mid-prepare) has its instances removed, and unprepare removes the instances its claim made.

With ``imex`` (``dradriver.imex_domains``), a claim that holds the node's IMEX channel and names a
GpuImexDomain in its opaque config (``dradriver.imex_domain.channel_domain``; bad parameters are the
claim's error) joins that domain before its spec is written: recorded as pending first, this node's
entry is added to the domain's status; unprepare removes it, and so does the start after a crash
mid-prepare. The checkpoint keeps the domain, so a restarted agent follows it again.

A share of a fractional GPU (``dradriver.shares``: a device several claims share, with the amounts
the allocator recorded in ``consumedCapacity``) gets the MPS edits the device plugin's Allocate
gives the same units (``share_edits``), and its answer carries the allocator's share ID.

A claim that cannot be prepared raises ``ClaimError`` with the reason, which becomes that claim's
error in the response (the kubelet retries); other claims of the same call are unaffected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devicemodel.inventory import NodeInventory
from devicemodel.state_file import write_json_atomically
from dradriver.checkpoint import CHECKPOINT_VERSION, load_checkpoint
from dradriver.claim_allocation import (
    ClaimError,
    ClaimRef,
    ClaimSource,
    Placement,
    PreparedDevice,
    our_results,
    placements_to_make,
    resolve_devices,
)
from dradriver.claim_cdi import ClaimSpecWriter, cdi_id, claim_spec
from dradriver.devices import DraDevice, DraKind
from dradriver.imex_domain import DomainRef, ImexDomainError, channel_domain
from dradriver.imex_domains import NodeImexDomains
from dradriver.mig_demand import MigOnDemand
from dradriver.share_units import UNIT_KINDS, UnitsError, unit_groups, units_by_request
from dradriver.shares import ShareAllocation, ShareEdits, ShareError, share_allocations, shares_wire
from hardware.device_nodes import HostDeviceNodes

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "dra-claims.json"
__all__ = ["CHECKPOINT_FILE", "ClaimError", "ClaimPreparer", "ClaimRef", "PreparedDevice"]


class ClaimPreparer:
    """Prepares and unprepares claims, checkpointed in ``state_dir``; with ``mig``, makes the MIG
    instances of allocated placements at prepare and removes them at unprepare; with ``imex``, joins
    the GpuImexDomain a claim names for the node's IMEX channel and leaves it at unprepare; with
    ``share_edits``, gives a share of a fractional GPU its MPS pipe directory and limits."""

    def __init__(
        self,
        *,
        pool: str,
        state_dir: Path,
        source: ClaimSource,
        devices: Callable[[], tuple[NodeInventory, Sequence[DraDevice]]],
        specs: ClaimSpecWriter,
        host: Callable[[], HostDeviceNodes],
        mig: MigOnDemand | None = None,
        imex: NodeImexDomains | None = None,
        share_edits: ShareEdits | None = None,
    ) -> None:
        self.pool = pool
        self._path = Path(state_dir) / CHECKPOINT_FILE
        self._source = source
        self._devices = devices
        self._specs = specs
        self._host = host
        self._mig = mig
        self._imex = imex
        self._share_edits = share_edits
        self.listeners: list[Callable[[], None]] = []  # called after each prepare and unprepare
        self._lock = threading.Lock()
        self._claims: dict[str, dict[str, Any]] = self._load()
        self._restore()

    def _load(self) -> dict[str, dict[str, Any]]:
        return load_checkpoint(self._path)  # one line naming the file when it is not right

    def _restore(self) -> None:
        """Specs of prepared claims written again; a claim whose MIG instances were being made, or
        whose IMEX domain was being joined, when the agent stopped (never answered to the kubelet)
        has them removed; stray specs removed; the IMEX domain of a prepared claim followed again."""
        for uid, entry in list(self._claims.items()):
            if entry.get("pending"):
                self._undo_mig(uid, entry.get("mig") or [])
                self._leave_pending(uid, entry)
                del self._claims[uid]
            elif not self._specs.exists(uid):
                self._specs.write(uid, entry["spec"])
        self._save()
        for uid, entry in self._claims.items():
            if entry.get("imex") and self._imex is not None:
                holder = f"{entry['namespace']}/{entry['name']}"
                self._imex.hold(uid=uid, holder=holder, ref=DomainRef.from_wire(entry["imex"]))
        for uid in self._specs.remove_all_but(self._claims):
            log.warning("removed the CDI spec of claim %s: written but never checkpointed", uid)

    def _undo_mig(self, uid: str, placements: Sequence[Sequence[Any]]) -> None:
        for index, profile, start in placements:
            try:
                if self._mig is not None:
                    self._mig.destroy(int(index), str(profile), int(start))
            except Exception as exc:  # reported; the instance stays for an operator (gpuweave mig apply)
                log.error(
                    "cannot remove MIG %s at slot %s on GPU %s of claim %s: %s",
                    profile,
                    start,
                    index,
                    uid,
                    exc,
                )

    def _leave_pending(self, uid: str, entry: Mapping[str, Any]) -> None:
        """Leave the domain a claim was joining when the agent stopped, unless a prepared claim
        holds the same domain here (then the node's entry is that claim's)."""
        if not entry.get("imex") or self._imex is None:
            return
        ref = DomainRef.from_wire(entry["imex"])
        if any(e.get("imex") == entry["imex"] and not e.get("pending") for e in self._claims.values()):
            return
        try:
            self._imex.leave(uid=uid, ref=ref)
        except Exception as exc:  # reported; the entry stays until someone removes it
            log.error("cannot remove this node's entry from %s (claim %s): %s", ref.describe(), uid, exc)

    def _undo_imex(self, uid: str) -> None:
        """Leave the domain claim ``uid`` joined in a prepare that then failed."""
        held = self._imex.held if self._imex is not None else None
        if held is None or held.uid != uid or self._imex is None:
            return
        try:
            self._imex.leave(uid=uid, ref=held.ref)
        except Exception as exc:  # reported; the next prepare of the claim joins again anyway
            log.error("cannot remove this node's entry from %s (claim %s): %s", held.ref.describe(), uid, exc)

    def _save(self) -> None:
        write_json_atomically(self._path, {"version": CHECKPOINT_VERSION, "claims": self._claims})

    def share_of(self, namespace: str, name: str, device: str) -> tuple[str, int] | None:
        """A prepared claim's share of a fractional GPU: (GPU UUID, memory GiB; 0: no limit)."""
        with self._lock:
            for entry in self._claims.values():
                share = (entry.get("shares") or {}).get(device)
                if share and (entry.get("namespace"), entry.get("name")) == (namespace, name):
                    return str(share["gpu"]), int(share["memoryGiB"])
        return None

    def prepared(self) -> dict[str, list[PreparedDevice]]:
        with self._lock:
            return {
                uid: [PreparedDevice.from_wire(d) for d in e["devices"]]
                for uid, e in self._claims.items()
                if not e.get("pending")
            }

    def _done(self, uid: str) -> list[PreparedDevice] | None:
        with self._lock:
            entry = self._claims.get(uid)
        if entry is None or entry.get("pending"):
            return None
        return [PreparedDevice.from_wire(d) for d in entry["devices"]]

    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        done = self._done(ref.uid)
        if done is not None:
            return done
        claim = self._source.get_claim(ref.namespace, ref.name)
        results = our_results(claim, ref=ref, pool=self.pool)
        wanted = [(str(r.get("request", "")), str(r.get("device", ""))) for r in results]
        shares = self._shares_of(ref, results)
        domain = self._domain_of(ref, claim, wanted)
        made = self._make_mig(ref, wanted)
        try:
            if domain is not None:
                self._join(ref, domain, made)
            return self._finish(ref, wanted, made, domain, shares)
        except Exception:
            self._undo_imex(ref.uid)
            if made:
                self._undo_mig(ref.uid, made)
            with self._lock:
                if (self._claims.get(ref.uid) or {}).get("pending"):
                    del self._claims[ref.uid]
                    self._save()
            raise

    def _shares_of(self, ref: ClaimRef, results: Sequence[Mapping[str, Any]]) -> dict[str, ShareAllocation]:
        """The claim's shares of fractional GPUs (``dradriver.shares``), by device name."""
        shared = {d.name for d in self._devices()[1] if d.allow_multiple}
        try:
            shares = share_allocations(results, shared=shared)
        except ShareError as exc:
            raise ClaimError(f"{ref.describe()}: {exc}") from None
        if shares and self._share_edits is None:
            raise ClaimError(f"{ref.describe()} holds a GPU share, but this agent shares no GPU through MPS")
        return shares

    def _share_extra(
        self, ref: ClaimRef, chosen: Sequence[DraDevice], shares: Mapping[str, ShareAllocation]
    ) -> dict[str, dict[str, Any]]:
        """Each share's MPS edits (pipe directory, limits), from the device plugin's Allocate code."""
        extra: dict[str, dict[str, Any]] = {}
        for device in chosen:
            share = shares.get(device.name)
            if share is None or self._share_edits is None or device.gpu_uuid is None:
                continue
            try:
                extra[device.name] = self._share_edits.edits(device.gpu_uuid, share)
            except ShareError as exc:
                raise ClaimError(f"{ref.describe()}: {exc}") from None
        return extra

    def _unit_groups(
        self, ref: ClaimRef, units: Mapping[str, Sequence[DraDevice]]
    ) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, tuple[str, ...]]]:
        """Per request of fractional-GPU units (an extended-resource claim): one CDI device with
        Allocate's edits for those unit IDs (``share_units.unit_groups``)."""
        if units and self._share_edits is None:
            raise ClaimError(f"{ref.describe()} holds GPU units, but this agent shares no GPU through MPS")
        try:
            return unit_groups(
                units,
                edits=self._share_edits.unit_edits if self._share_edits else None,
                name=lambda n: cdi_id(ref.uid, n),
            )
        except UnitsError as exc:
            raise ClaimError(f"{ref.describe()}: {exc}") from None

    def _domain_of(
        self, ref: ClaimRef, claim: Mapping[str, Any], wanted: Sequence[tuple[str, str]]
    ) -> DomainRef | None:
        """The GpuImexDomain the claim's config names for the node's IMEX channel, if any."""
        channels = {d.name for d in self._devices()[1] if d.kind is DraKind.IMEX_CHANNEL}
        try:
            name = channel_domain(claim, wanted=wanted, channels=channels)
        except ImexDomainError as exc:
            raise ClaimError(f"{ref.describe()}: {exc}") from None
        if name is None:
            return None
        if self._imex is None:
            raise ClaimError(
                f"{ref.describe()} names IMEX domain {name}, but this agent joins no IMEX domains "
                "(it runs without the API server's GpuImexDomain objects)"
            )
        return DomainRef(ref.namespace, name)  # a claim joins a domain of its own namespace only

    def _join(self, ref: ClaimRef, domain: DomainRef, made: list[Placement]) -> None:
        """Recorded as pending first (a crash before the answer leaves the domain at the next
        start), then this node's entry written to the domain's status."""
        assert self._imex is not None  # _domain_of refused the claim otherwise
        with self._lock:
            known = self._claims.get(ref.uid)
            if known is None or known.get("pending"):  # not a concurrent call's finished entry
                entry = {"namespace": ref.namespace, "name": ref.name, "pending": True, "mig": made}
                self._claims[ref.uid] = {**entry, "imex": domain.to_wire()}
                self._save()
        try:
            self._imex.join(uid=ref.uid, holder=f"{ref.namespace}/{ref.name}", ref=domain)
        except Exception as exc:  # the domain missing or full, the API unreachable: the kubelet retries
            raise ClaimError(f"{ref.describe()}: cannot join {domain.describe()}: {exc}") from None

    def _make_mig(self, ref: ClaimRef, wanted: Sequence[tuple[str, str]]) -> list[Placement]:
        """Make the MIG instances the claim's placements need, recorded as pending first so a crash
        in between leaves nothing behind after the next start."""
        needed = placements_to_make(wanted, self._devices()[1])
        if not needed or self._mig is None:
            return []
        with self._lock:
            self._claims[ref.uid] = {
                "namespace": ref.namespace,
                "name": ref.name,
                "pending": True,
                "mig": needed,
            }
            self._save()
        made: list[Placement] = []
        try:
            for index, profile, start in needed:
                self._mig.create(index, profile, start)
                made.append((index, profile, start))
        except Exception as exc:
            self._undo_mig(ref.uid, made)
            with self._lock:
                self._claims.pop(ref.uid, None)
                self._save()
            raise ClaimError(f"{ref.describe()}: cannot make its MIG instance: {exc}") from None
        log.info("made MIG instances for %s: %s", ref.describe(), made)
        return made

    def _finish(
        self,
        ref: ClaimRef,
        wanted: Sequence[tuple[str, str]],
        made: list[Placement],
        domain: DomainRef | None = None,
        shares: Mapping[str, ShareAllocation] | None = None,
    ) -> list[PreparedDevice]:
        inventory, devices = self._devices()
        chosen = resolve_devices(ref, wanted, devices)
        extra = self._share_extra(ref, chosen, shares or {})
        groups, unit_cdi = self._unit_groups(ref, units_by_request(wanted, {d.name: d for d in chosen}))
        spec, problems = claim_spec(
            ref.uid, inventory, chosen, host=self._host(), extra=extra, unit_groups=groups
        )
        for problem in problems:
            log.warning("CDI spec of %s: %s", ref.describe(), problem)
        requests: dict[str, list[str]] = {}
        for request, name in wanted:
            requests.setdefault(name, []).append(request)
        share_ids = {name: share.share_id for name, share in (shares or {}).items()}
        prepared = [
            PreparedDevice(
                tuple(requests[d.name]),
                self.pool,
                d.name,
                unit_cdi.get(d.name, ()) if d.kind in UNIT_KINDS else (cdi_id(ref.uid, d.name),),
                share_ids.get(d.name),
            )
            for d in chosen
        ]
        with self._lock:
            if ref.uid in self._claims and not self._claims[ref.uid].get("pending"):
                return [
                    PreparedDevice.from_wire(d) for d in self._claims[ref.uid]["devices"]
                ]  # a concurrent call
            self._specs.write(ref.uid, spec)
            entry = {"namespace": ref.namespace, "name": ref.name, "devices": [p.to_wire() for p in prepared]}
            self._claims[ref.uid] = {
                **entry,
                "spec": spec,
                "mig": made,
                "shares": shares_wire(chosen, shares),
            }
            if domain is not None:
                self._claims[ref.uid]["imex"] = domain.to_wire()
            try:
                self._save()
            except OSError as exc:
                del self._claims[ref.uid]
                self._specs.remove(ref.uid)
                raise ClaimError(f"{ref.describe()}: cannot checkpoint it in {self._path} ({exc})") from None
        log.info("prepared %s: %s", ref.describe(), ", ".join(d.name for d in chosen))
        self._changed()
        return prepared

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    def unprepare(self, ref: ClaimRef) -> None:
        with self._lock:
            entry = self._claims.get(ref.uid)
        if entry is None:
            self._specs.remove(ref.uid)  # never prepared, or already unprepared
            return
        if entry.get("imex") and self._imex is not None:
            domain = DomainRef.from_wire(entry["imex"])
            try:
                self._imex.leave(uid=ref.uid, ref=domain)
            except Exception as exc:  # the kubelet retries the unprepare
                raise ClaimError(
                    f"{ref.describe()}: cannot remove this node from {domain.describe()}: {exc}"
                ) from None
        for index, profile, start in entry.get("mig") or []:
            if self._mig is None:
                break
            try:
                self._mig.destroy(int(index), str(profile), int(start))
            except Exception as exc:  # the kubelet retries the unprepare
                raise ClaimError(
                    f"{ref.describe()}: cannot remove its MIG instance {profile} at slot {start} "
                    f"on GPU {index}: {exc}"
                ) from None
        with self._lock:
            self._claims.pop(ref.uid, None)
            try:
                self._save()
            except OSError as exc:
                self._claims[ref.uid] = entry
                raise ClaimError(
                    f"{ref.describe()}: cannot update the checkpoint {self._path} ({exc})"
                ) from None
            self._specs.remove(ref.uid)
        log.info("unprepared %s", ref.describe())
        self._changed()
