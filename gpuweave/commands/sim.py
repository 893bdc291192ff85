"""`gpuweave sim inject`: inject a fault into a running simulated node agent.

The request goes over the agent's control socket (``STATE_DIR/agent.sock``) to its ``sim.inject``
command, which raises the fault in the simulated hardware: the NVML event, the kernel-log line
and the device's counters change exactly as the driver's would. See docs/health.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from nodeagent.control import call_agent


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help="act on a running simulated node agent (fault injection)",
        description="Act on a running simulated node agent (`gpuweave node-agent --simulate ...`).",
    )
    verbs = parser.add_subparsers(dest="sim_command", metavar="VERB")
    inject = verbs.add_parser(
        "inject",
        help="inject a fault: Xid, ECC DBE, NVLink down, EFA, NVML hang, bad memory, slow link, hang",
        description="Inject a fault into the simulated hardware of a running node agent.",
    )
    add = inject.add_argument
    add("--state-dir", type=Path, required=True, help="the agent's --state-dir (holds agent.sock)")
    add("--gpu", type=int, metavar="INDEX", help="GPU index the fault hits")
    add("--xid", type=int, metavar="N", help="raise Xid N on --gpu (NVML event + kernel-log line)")
    add(
        "--mig-instance",
        metavar="GI[:CI]",
        help="attribute --xid (or --busy) to this GPU (and compute) instance",
    )
    add(
        "--recovery-action",
        type=int,
        metavar="N",
        help="driver recovery action N on --gpu (Xid 154; 1 reset, 2 reboot)",
    )
    add(
        "--reset-fails",
        action="store_true",
        help="--gpu's resets fail from now on (it stays off the bus): remediation moves to a reboot",
    )
    add("--ecc-dbe", type=int, metavar="COUNT", help="add COUNT volatile double-bit ECC errors on --gpu")
    add("--nvlink-down", type=int, metavar="LINK", help="take NVLink link LINK of --gpu down")
    add("--efa-down", metavar="NAME", help="take EFA adapter NAME's netdev link down")
    add("--efa-missing", metavar="NAME", help="remove EFA adapter NAME from the node")
    add("--efa-stalled", metavar="NAME", help="EFA adapter NAME stops completing commands (counters)")
    add("--nvml-hang", type=float, metavar="SECONDS", help="NVML calls hang (on --gpu, or every call)")
    add("--temperature", type=int, metavar="CELSIUS", help="set --gpu's temperature")
    add(
        "--fabric-state",
        choices=("not-started", "in-progress", "completed", "failed"),
        help="the NVSwitch fabric's state (NVML on Hopper+, the Fabric Manager service on Ampere)",
    )
    add(
        "--busy",
        metavar="PID[,PID...]",
        help="processes on --gpu, or on its MIG device with --mig-instance ('' frees it); remediation waits",
    )
    add(
        "--kill-mps-daemon",
        action="store_true",
        help="SIGKILL --gpu's MPS control daemon (a fractional GPU): its shares are withheld until restarted",
    )
    add(
        "--bad-memory",
        type=_offset,
        metavar="OFFSET",
        help="a stuck memory cell at byte OFFSET of --gpu (0x... allowed); an active check finds it",
    )
    add("--slow-nvlink", type=int, metavar="PEER", help="the NVLink pair --gpu - PEER runs at half its lanes")
    add("--pcie-width", type=int, metavar="WIDTH", help="--gpu's PCIe link trains at xWIDTH")
    add(
        "--check-hang",
        type=float,
        metavar="SECONDS",
        help="active checks hang (on --gpu, or every GPU's) for SECONDS",
    )
    add("--clear", action="store_true", help="undo injected faults (on --gpu, or everything)")
    add("--timeout", type=float, default=10.0, help="seconds to wait for the agent (default 10)")
    inject.set_defaults(handler=run_inject)
    parser.set_defaults(handler=run_without_verb)


def _offset(text: str) -> int:
    """A byte offset, decimal or 0x-hex."""
    try:
        return int(text, 0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte offset (decimal, or 0x... hex)") from exc


def run_without_verb(args: argparse.Namespace) -> int:
    raise GpuweaveError("say what to do: `gpuweave sim inject --state-dir DIR ...` (see --help)")


def inject_params(args: argparse.Namespace) -> dict[str, Any]:
    """The ``sim.inject`` request for the parsed options (only the options given)."""
    names = (
        "gpu",
        "xid",
        "mig_instance",
        "ecc_dbe",
        "nvlink_down",
        "efa_down",
        "efa_missing",
        "efa_stalled",
        "nvml_hang",
        "temperature",
        "recovery_action",
        "fabric_state",
        "bad_memory",
        "slow_nvlink",
        "pcie_width",
        "check_hang",
    )
    params: dict[str, Any] = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.busy is not None:
        try:
            params["busy"] = [int(pid) for pid in args.busy.split(",") if pid.strip()]
        except ValueError as exc:
            raise GpuweaveError(f"--busy takes comma-separated process ids, got {args.busy!r}") from exc
    if args.clear:
        params["clear"] = True
    if args.kill_mps_daemon:
        params["kill_mps_daemon"] = True
    if args.reset_fails:
        params["reset_fails"] = True
    return params


def run_inject(args: argparse.Namespace) -> int:
    result = call_agent(args.state_dir, "sim.inject", inject_params(args), timeout=args.timeout)
    for line in result.get("done", []):
        print(line)
    if not result.get("done"):
        print(json.dumps(result))
    return 0
