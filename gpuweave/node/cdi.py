"""The node agent's CDI wiring: where its specs go and how Allocate names devices to the runtime.

``--cdi-spec-dir`` defaults to the standard dynamic spec directory ``/var/run/cdi`` on a node and to
``STATE_DIR/cdi`` with ``--simulate`` (a simulated node never writes into the host's runtime
configuration); ``none`` turns the specs off for nodes whose runtime runs the NVIDIA Container
Toolkit in legacy mode only (then ``--device-list-strategy envvar`` or ``volume-mounts``).
The host's device nodes are read below the simulated tree's root with ``--simulate``, below ``/``
otherwise.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from devicemodel.errors import GpuweaveError
from hardware.backend import GpuBackend
from hardware.device_nodes import read_host_device_nodes
from hardware.simulated.backend import SimulatedBackend
from nodeagent.allocation import DeviceListing, DeviceListStrategy, parse_strategies
from nodeagent.cdi import DEFAULT_CDI_SPEC_DIR, CdiPublisher, CdiSpecWriter

DEFAULT_STRATEGY = "envvar,cdi-cri"
SIMULATED_SPEC_SUBDIR = "cdi"


def add_cdi_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cdi-spec-dir",
        metavar="DIR|none",
        default=None,
        help=f"where the agent writes its CDI specs (default {DEFAULT_CDI_SPEC_DIR}; with --simulate "
        "STATE_DIR/cdi; 'none': no specs, for a runtime without CDI; docs/deploy.md)",
    )
    parser.add_argument(
        "--device-list-strategy",
        metavar="LIST",
        default=DEFAULT_STRATEGY,
        help="how Allocate names devices to the runtime, one or more of envvar, volume-mounts, "
        f"cdi-annotations, cdi-cri (default {DEFAULT_STRATEGY}; docs/device-plugin.md)",
    )


def host_root(backend: GpuBackend) -> Path:
    return backend.sysfs_root if isinstance(backend, SimulatedBackend) else Path("/")


def spec_dir(args: argparse.Namespace) -> Path | None:
    value = args.cdi_spec_dir
    if value is not None and value.strip().lower() in ("", "none"):
        return None
    if value is not None:
        return Path(value)
    return args.state_dir / SIMULATED_SPEC_SUBDIR if args.simulate else DEFAULT_CDI_SPEC_DIR


def check_cdi_arguments(args: argparse.Namespace) -> frozenset[DeviceListStrategy]:
    """The strategies named by the flag, checked before anything starts: CDI names need specs, so a
    CDI strategy with ``--cdi-spec-dir none`` is refused in one line."""
    try:
        strategies = parse_strategies(args.device_list_strategy)
    except ValueError as exc:
        raise GpuweaveError(f"--device-list-strategy: {exc}") from None
    if DeviceListing(strategies=strategies).uses_cdi and spec_dir(args) is None:
        cdi = sorted(s.value for s in strategies if s.value.startswith("cdi-"))
        raise GpuweaveError(
            f"--device-list-strategy {','.join(cdi)} names CDI devices but --cdi-spec-dir is none: "
            "give a spec directory or use envvar / volume-mounts only"
        )
    return strategies


def device_listing(args: argparse.Namespace, backend: GpuBackend) -> DeviceListing:
    """The checked strategies and, for EFA grants, the host's ``rdma_cm`` node where it has one."""
    strategies = check_cdi_arguments(args)
    rdma_cm = read_host_device_nodes(host_root(backend)).rdma_cm
    return DeviceListing(strategies=strategies, rdma_cm=rdma_cm.path if rdma_cm else None)


def cdi_publisher(args: argparse.Namespace, backend: GpuBackend) -> CdiPublisher | None:
    directory = spec_dir(args)
    if directory is None:
        return None
    return CdiPublisher(CdiSpecWriter(directory), host=partial(read_host_device_nodes, host_root(backend)))
