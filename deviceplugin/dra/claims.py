"""NodePrepareResources / NodeUnprepareResources: what a claim's devices are and how they are handed out.

``ClaimPreparer`` is the kubelet-facing core of the DRA plugin, with no gRPC in it. Preparing a claim
reads the ResourceClaim from the API server (``ClaimSource``), takes its allocation results for driver
``gpuweave.io`` in this node's pool, maps each device name back to the device model
(``deviceplugin.dra.devices``), writes the claim's CDI spec (``claim_cdi``) and returns the CDI
device IDs. Every prepared claim is checkpointed in ``STATE_DIR/dra-claims.json`` (replaced
atomically) before the answer goes back, so:

- prepare is idempotent: a claim already prepared (in this run or an earlier one) gets the same
  answer without reading the API server or writing anything;
- unprepare is idempotent: an unknown claim is already unprepared;
- an agent restart neither leaks nor double-prepares: the checkpoint is read at start, a spec file
  missing for a checkpointed claim is written again, and a spec file without a checkpoint entry
  (a crash between the two writes) is removed, since the kubelet was never told about it.

A claim that cannot be prepared raises ``ClaimError`` with the reason, which becomes that claim's
error in the response (the kubelet retries); other claims of the same call are unaffected.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.dra.claim_cdi import ClaimSpecWriter, cdi_id, claim_spec
from deviceplugin.dra.devices import DRIVER, DraDevice
from hardware.device_nodes import HostDeviceNodes
from topology.errors import GpuweaveError
from topology.inventory import NodeInventory
from topology.state_file import write_json_atomically

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "dra-claims.json"
CHECKPOINT_VERSION = 1


class ClaimError(GpuweaveError):
    """A claim this node cannot prepare (reported for that claim only)."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    uid: str
    namespace: str
    name: str

    def describe(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device as the kubelet's ``Device`` message carries it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "requestNames": list(self.request_names),
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIDs": list(self.cdi_device_ids),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PreparedDevice:
        return cls(
            tuple(data["requestNames"]),
            str(data["poolName"]),
            str(data["deviceName"]),
            tuple(data["cdiDeviceIDs"]),
        )


class ClaimSource(Protocol):
    """Reads a ResourceClaim (its JSON, camelCase); raises ``ClaimError`` when it cannot."""

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


def allocated_here(claim: Mapping[str, Any], *, ref: ClaimRef, pool: str) -> list[tuple[str, str]]:
    """(request name, device name) of every allocation result for our driver in our pool."""
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"{ref.describe()}: the API server has uid {uid}; the claim was replaced, not preparing it"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{ref.describe()} is not allocated yet")
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [
        (str(r.get("request", "")), str(r.get("device", "")))
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == DRIVER and r.get("pool") == pool
    ]
    if not ours:
        raise ClaimError(
            f"{ref.describe()} has no device of driver {DRIVER} in pool {pool}: nothing to prepare here"
        )
    return ours


def _resolve(
    ref: ClaimRef, wanted: Sequence[tuple[str, str]], devices: Sequence[DraDevice]
) -> list[DraDevice]:
    by_name = {d.name: d for d in devices}
    chosen: list[DraDevice] = []
    for _, name in wanted:
        device = by_name.get(name)
        if device is None:
            raise ClaimError(f"{ref.describe()}: device {name} is not in this node's pool any more")
        if device.lost:
            raise ClaimError(
                f"{ref.describe()}: GPU {name} is unreachable (off the bus); it cannot be prepared"
            )
        if device.plugin is None:
            raise ClaimError(
                f"{ref.describe()}: device {name} is a MIG placement with no MIG instance; creating MIG "
                "instances at prepare is not supported yet: create it (gpuweave mig apply) or use "
                "--dra-mig static"
            )
        if device not in chosen:
            chosen.append(device)
    return chosen


class ClaimPreparer:
    """Prepares and unprepares claims, checkpointed in ``state_dir``."""

    def __init__(
        self,
        *,
        pool: str,
        state_dir: Path,
        source: ClaimSource,
        devices: Callable[[], tuple[NodeInventory, Sequence[DraDevice]]],
        specs: ClaimSpecWriter,
        host: Callable[[], HostDeviceNodes],
    ) -> None:
        self.pool = pool
        self._path = Path(state_dir) / CHECKPOINT_FILE
        self._source = source
        self._devices = devices
        self._specs = specs
        self._host = host
        self._lock = threading.Lock()
        self._claims: dict[str, dict[str, Any]] = self._load()
        self._restore_specs()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise GpuweaveError(
                f"cannot read the DRA claim checkpoint {self._path} ({exc}): the agent does not know which "
                "claims are prepared; fix or remove the file (the kubelet prepares running claims again)"
            ) from None
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
            raise GpuweaveError(f"DRA claim checkpoint {self._path} is not version {CHECKPOINT_VERSION}")
        return dict(data.get("claims") or {})

    def _restore_specs(self) -> None:
        for uid, entry in self._claims.items():
            if not self._specs.exists(uid):
                self._specs.write(uid, entry["spec"])
        for uid in self._specs.remove_all_but(self._claims):
            log.warning("removed the CDI spec of claim %s: written but never checkpointed", uid)

    def _save(self) -> None:
        write_json_atomically(self._path, {"version": CHECKPOINT_VERSION, "claims": self._claims})

    def prepared(self) -> dict[str, list[PreparedDevice]]:
        with self._lock:
            return {
                uid: [PreparedDevice.from_wire(d) for d in e["devices"]] for uid, e in self._claims.items()
            }

    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        with self._lock:
            entry = self._claims.get(ref.uid)
        if entry is not None:
            return [PreparedDevice.from_wire(d) for d in entry["devices"]]
        wanted = allocated_here(self._source.get_claim(ref.namespace, ref.name), ref=ref, pool=self.pool)
        inventory, devices = self._devices()
        chosen = _resolve(ref, wanted, devices)
        spec, problems = claim_spec(ref.uid, inventory, chosen, host=self._host())
        for problem in problems:
            log.warning("CDI spec of %s: %s", ref.describe(), problem)
        requests: dict[str, list[str]] = {}
        for request, name in wanted:
            requests.setdefault(name, []).append(request)
        prepared = [
            PreparedDevice(tuple(requests[d.name]), self.pool, d.name, (cdi_id(ref.uid, d.name),))
            for d in chosen
        ]
        with self._lock:
            if ref.uid in self._claims:  # prepared meanwhile by a concurrent call
                return [PreparedDevice.from_wire(d) for d in self._claims[ref.uid]["devices"]]
            self._specs.write(ref.uid, spec)
            self._claims[ref.uid] = {
                "namespace": ref.namespace,
                "name": ref.name,
                "devices": [p.to_wire() for p in prepared],
                "spec": spec,
            }
            try:
                self._save()
            except OSError as exc:
                del self._claims[ref.uid]
                self._specs.remove(ref.uid)
                raise ClaimError(f"{ref.describe()}: cannot checkpoint it in {self._path} ({exc})") from None
        log.info("prepared %s: %s", ref.describe(), ", ".join(d.name for d in chosen))
        return prepared

    def unprepare(self, ref: ClaimRef) -> None:
        with self._lock:
            entry = self._claims.pop(ref.uid, None)
            if entry is None:
                self._specs.remove(ref.uid)  # never prepared, or already unprepared
                return
            try:
                self._save()
            except OSError as exc:
                self._claims[ref.uid] = entry
                raise ClaimError(
                    f"{ref.describe()}: cannot update the checkpoint {self._path} ({exc})"
                ) from None
            self._specs.remove(ref.uid)
        log.info("unprepared %s", ref.describe())
