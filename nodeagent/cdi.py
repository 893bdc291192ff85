"""CDI specs for the devices the agent serves, so a runtime with CDI on can start their containers.

Allocate names every GPU, MIG device and GPU share as ``nvidia.com/gpu=<uuid>`` and every EFA adapter
as ``vpc.amazonaws.com/efa=<name>`` (``nodeagent.allocation``). containerd and CRI-O refuse a
container whose CDI names they cannot resolve, and a MIG reshape makes new MIG UUIDs with new
``nvidia-caps`` nodes, so the agent writes the specs itself from the inventory it serves:

- ``gpuweave-nvidia.com-gpu.json``: one device per served whole GPU (its ``/dev/nvidiaN``) and per
  MIG device (its parent's node plus the GPU-instance and compute-instance access nodes); the
  control nodes every CUDA process opens (``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``,
  ``nvidia-modeset`` where present) are the spec's common edits.
- ``gpuweave-vpc.amazonaws.com-efa.json``: one device per EFA adapter (its ``uverbsN``), with
  ``rdma_cm`` as the common edit.

Device nodes carry their type and numbers, so a runtime never has to stat the host path. Driver
libraries and binaries are not listed: the NVIDIA Container Toolkit's hook injects them
(docs/deploy.md). ``cdiVersion`` is the lowest version whose features the spec uses (``hostPath``:
0.5.0), which is what the CDI library itself writes and what every CDI-capable runtime parses.

``build_specs`` is pure; ``CdiSpecWriter`` replaces the files atomically and removes the agent's
own files that are no longer wanted (a spec from an earlier run, EFA gone), never anyone else's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devicemodel.inventory import NodeInventory
from devicemodel.state_file import replace_file_atomically
from hardware.device_nodes import CharDevice, HostDeviceNodes
from nodeagent.allocation import CDI_KIND_EFA, CDI_KIND_GPU
from nodeagent.devices import DeviceKind, PluginDevice

log = logging.getLogger(__name__)

CDI_VERSION = "0.5.0"
SPEC_FILE_PREFIX = "gpuweave-"
DEFAULT_CDI_SPEC_DIR = Path("/var/run/cdi")
_SHARE_KINDS = (DeviceKind.GPU, DeviceKind.COMPUTE, DeviceKind.MEMORY, DeviceKind.REPLICA)


@dataclass(frozen=True)
class CdiSpecs:
    """Spec file name -> spec, and what could not be described (logged by the writer)."""

    files: dict[str, dict[str, Any]]
    problems: tuple[str, ...] = ()

    def names(self) -> set[str]:
        """Every qualified CDI name the specs define."""
        specs = self.files.values()
        return {f"{spec['kind']}={device['name']}" for spec in specs for device in spec["devices"]}


def spec_file_name(kind: str) -> str:
    """``gpuweave-<vendor>-<class>.json``: one file per vendor and class, as CDI suggests."""
    return SPEC_FILE_PREFIX + kind.replace("/", "-") + ".json"


def _node(device: CharDevice) -> dict[str, Any]:
    return {
        "path": device.path,
        "hostPath": device.path,
        "type": "c",
        "major": device.major,
        "minor": device.minor,
        "permissions": "rw",
    }


def _spec(kind: str, devices: list[dict[str, Any]], common: Iterable[CharDevice]) -> dict[str, Any]:
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices}
    nodes = [_node(d) for d in common]
    if nodes:
        spec["containerEdits"] = {"deviceNodes": nodes}
    return spec


def _device(name: str, nodes: Iterable[CharDevice]) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"deviceNodes": [_node(n) for n in nodes]}}


def _gpu_devices(
    inventory: NodeInventory, served: Iterable[PluginDevice], host: HostDeviceNodes
) -> tuple[list[dict[str, Any]], list[str]]:
    """One CDI device per served GPU UUID (whole or shared) and per served MIG UUID."""
    gpus = {g.uuid: g for g in inventory.gpus}
    migs = {m.uuid: m for m in inventory.mig_devices}
    devices: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for device in served:
        if device.kind in _SHARE_KINDS and device.gpu_uuid in gpus:
            gpu = gpus[device.gpu_uuid]
            devices[gpu.uuid] = _device(gpu.uuid, [host.gpu_node(gpu.minor)])
        elif device.kind is DeviceKind.MIG and device.id in migs:
            mig = migs[device.id]
            parent = gpus[mig.parent_uuid]
            caps = host.mig_caps(parent.minor, gi=mig.gpu_instance_id, ci=mig.compute_instance_id)
            if caps is None:
                problems.append(
                    f"MIG device {mig.uuid} (GPU {parent.index}, GI {mig.gpu_instance_id}, CI "
                    f"{mig.compute_instance_id}): no nvidia-caps minor in /proc/driver/nvidia-caps/"
                    "mig-minors; its CDI device has the parent GPU's node only and CUDA will not see it"
                )
            devices[mig.uuid] = _device(mig.uuid, [host.gpu_node(parent.minor), *(caps or ())])
    return [devices[name] for name in sorted(devices)], problems


def _efa_devices(
    served: Iterable[PluginDevice], host: HostDeviceNodes
) -> tuple[list[dict[str, Any]], list[str]]:
    devices: list[dict[str, Any]] = []
    problems: list[str] = []
    for device in served:
        if device.kind is not DeviceKind.EFA:
            continue
        nodes = [host.uverbs[path] for path in device.device_nodes if path in host.uverbs]
        if len(nodes) != len(device.device_nodes) or not nodes:
            wanted = ", ".join(device.device_nodes) or "its uverbs node"
            problems.append(
                f"EFA adapter {device.id}: no device numbers for {wanted} under "
                "/sys/class/infiniband_verbs; left out of the CDI spec"
            )
            continue
        devices.append(_device(device.id, nodes))
    return sorted(devices, key=lambda d: str(d["name"])), problems


def build_specs(
    inventory: NodeInventory, served: Iterable[PluginDevice], *, host: HostDeviceNodes
) -> CdiSpecs:
    """The spec files for exactly the devices in ``served`` (every resource's list)."""
    served = list(served)
    files: dict[str, dict[str, Any]] = {}
    gpu_devices, problems = _gpu_devices(inventory, served, host)
    if gpu_devices:
        files[spec_file_name(CDI_KIND_GPU)] = _spec(CDI_KIND_GPU, gpu_devices, host.control)
    efa_devices, efa_problems = _efa_devices(served, host)
    if efa_devices:
        common = [host.rdma_cm] if host.rdma_cm is not None else []
        files[spec_file_name(CDI_KIND_EFA)] = _spec(CDI_KIND_EFA, efa_devices, common)
    return CdiSpecs(files, tuple(problems + efa_problems))


def other_spec_names(path: Path) -> frozenset[str]:
    """The qualified names another tool's spec file defines (none when it does not parse)."""
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
    except (OSError, ValueError, yaml.YAMLError):
        return frozenset()
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return frozenset()
    return frozenset(f"{data.get('kind')}={d.get('name')}" for d in data["devices"] if isinstance(d, dict))


def conflicts(
    spec_dir: Path, specs: CdiSpecs, *, names_in: Callable[[Path], frozenset[str]] = other_spec_names
) -> list[str]:
    """Other tools' spec files in ``spec_dir`` that define one of our names: the CDI library drops a
    name that two specs of one directory define, so neither definition resolves."""
    ours = specs.names()
    found: list[str] = []
    for path in sorted(spec_dir.glob("*")):
        if path.name.startswith(SPEC_FILE_PREFIX) or path.suffix not in (".json", ".yaml"):
            continue
        clash = sorted(names_in(path) & ours)
        if clash:
            found.append(
                f"{path} also defines {len(clash)} of the agent's CDI devices ({clash[0]}, ...); a runtime "
                "resolves neither: stop the tool that writes it (the NVIDIA Container Toolkit's "
                "nvidia-cdi-refresh, or the GPU operator's CDI spec) or give the agent another --cdi-spec-dir"
            )
    return found


class CdiSpecWriter:
    """Keeps the agent's spec files in ``spec_dir`` equal to the last ``CdiSpecs`` given.

    A file is rewritten only when its content changes (atomically: a runtime reading the directory
    sees the old spec or the new one); a ``gpuweave-*`` file not among the specs is removed, so the
    first write after a start replaces whatever an earlier run left. Other tools' files are kept.
    """

    def __init__(self, spec_dir: Path) -> None:
        self.spec_dir = Path(spec_dir)
        self._lock = threading.Lock()
        self._written: dict[str, bytes] = {}
        self._reported: set[str] = set()
        self._others: dict[Path, tuple[tuple[int, int], frozenset[str]]] = {}  # parsed once per version

    def write(self, specs: CdiSpecs) -> None:
        """Write ``specs``; an ``OSError`` (full or read-only directory) is raised to the caller."""
        with self._lock:
            self.spec_dir.mkdir(parents=True, exist_ok=True)
            for name, spec in specs.files.items():
                payload = (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
                if self._written.get(name) != payload or not (self.spec_dir / name).exists():
                    replace_file_atomically(self.spec_dir / name, payload)
                    self._written[name] = payload
            for path in self._own_files():
                if path.name not in specs.files:
                    path.unlink(missing_ok=True)
                    self._written.pop(path.name, None)
            problems = [*specs.problems, *conflicts(self.spec_dir, specs, names_in=self._names_in)]
            for problem in problems:
                if problem not in self._reported:
                    log.warning("CDI spec: %s", problem)
            self._reported = set(problems)

    def _names_in(self, path: Path) -> frozenset[str]:
        """``other_spec_names``, parsed again only when the file's mtime or size changes: another
        tool's spec can be large YAML, and this runs on every change under the agent's lock."""
        try:
            info = path.stat()
        except OSError:
            return frozenset()
        version = (info.st_mtime_ns, info.st_size)
        cached = self._others.get(path)
        if cached is None or cached[0] != version:
            cached = (version, other_spec_names(path))
            self._others[path] = cached
        return cached[1]

    def _own_files(self) -> list[Path]:
        return [
            p
            for p in self.spec_dir.glob(SPEC_FILE_PREFIX + "*")
            if p.suffix in (".json", ".yaml") and p.is_file()
        ]

    def read(self) -> dict[str, Mapping[str, Any]]:
        """The agent's spec files as they are on disk (for tests and tools)."""
        return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(self._own_files())}


def merge_specs(old: CdiSpecs, new: CdiSpecs) -> CdiSpecs:
    """Every device of both (``new`` wins a name): what stays valid while a change is applied."""
    files = {name: dict(spec) for name, spec in old.files.items()}
    for name, spec in new.files.items():
        kept = {d["name"]: d for d in files.get(name, {}).get("devices", [])}
        kept |= {d["name"]: d for d in spec["devices"]}
        files[name] = {**spec, "devices": [kept[n] for n in sorted(kept)]}
    return CdiSpecs(files, new.problems)


class CdiPublisher:
    """The node agent's side: specs follow the served devices in two steps around each change.

    ``prepare`` (before a device list changes) writes the union of what is served now and what will
    be, so a device is defined before the kubelet can hand it out and a container starting during
    the change still resolves a device on its way out; ``commit`` (after) writes exactly the new
    set, so a removed device disappears. A write that fails is logged and retried at the next change.
    """

    def __init__(self, writer: CdiSpecWriter, *, host: Callable[[], HostDeviceNodes]) -> None:
        self.writer = writer
        self._host = host
        self._current = CdiSpecs({})
        self._next: CdiSpecs | None = None
        self.failures = 0

    def prepare(self, inventory: NodeInventory, served: Iterable[PluginDevice]) -> None:
        self._next = build_specs(inventory, served, host=self._host())
        self._write(merge_specs(self._current, self._next))

    def commit(self) -> None:
        if self._next is not None and self._write(self._next):
            self._current, self._next = self._next, None

    def _write(self, specs: CdiSpecs) -> bool:
        try:
            self.writer.write(specs)
        except OSError as exc:
            self.failures += 1
            log.error(
                "cannot write CDI specs to %s (%s): containers asking for these devices will not "
                "start under a CDI runtime until the directory is writable (--cdi-spec-dir)",
                self.writer.spec_dir,
                exc,
            )
            return False
        return True
