"""`gpuweave extender`: run the kube-scheduler extender (filter, prioritize, bind, preempt)."""

from __future__ import annotations

import argparse
import gc
import threading
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.gangs import BadGangError, parse_expected_duration
from gpuweave.stopping import stop_on_signals, wait_for
from scheduler_ext.api import (
    DEFAULT_DURATION_S,
    DEFAULT_HOLD_SHARE,
    DEFAULT_JOB_DURATION_S,
    DEFAULT_KEEP,
    DEFAULT_LEASE_NAME,
    DEFAULT_MAX_WAIT_S,
    DEFAULT_RETRY_S,
    DEFAULT_STRETCH_PER_STEP,
    DEFAULT_TTL_S,
    FRESH_S,
    HOLD_LIMIT_FLAG,
    PERCENT_FLOOR_GPUS,
    TIMEOUT_S,
    Extender,
    GangSettings,
    HoldLimit,
    LeaseSettings,
    PreflightSettings,
    TierCostSettings,
    build_kube_extender,
    build_snapshot_extender,
    lease_settings,
    load_workload_file,
)
from topology.network import DEFAULT_TIER_LABELS, parse_tier_labels


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "extender",
        help="run the kube-scheduler extender",
        description=(
            "Serve the kube-scheduler extender protocol (POST /filter, /prioritize, /bind, /preempt; "
            "GET /healthz, /readyz, /metrics, /workload) over a cache of nodes, GpuNodeInventory "
            "objects and pods, fed by watches (--kubeconfig) or loaded from a Kubernetes List file "
            "(--snapshot). gpu-selectors are bounded: an estimated CEL cost over 1,000,000 is "
            "refused at once, others that loop run in worker processes with a 0.25 s deadline. "
            "The listen backlog is 1024 connections."
        ),
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8888",
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:8888; port 0 picks a free one)",
    )
    parser.add_argument(
        "--probe-listen",
        metavar="HOST:PORT",
        help=(
            "also serve GET /healthz, /readyz and /metrics (nothing else) here, for kubelet probes "
            "while --listen stays on loopback; for example 0.0.0.0:8889"
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--kubeconfig", metavar="FILE", help="watch the cluster this kubeconfig names")
    source.add_argument("--in-cluster", action="store_true", help="watch the cluster the pod runs in")
    source.add_argument("--snapshot", metavar="FILE", help="serve a Kubernetes List (YAML or JSON) offline")
    parser.add_argument(
        "--workload",
        metavar="FILE",
        help=(
            "pin the workload the scorer places against (YAML or JSON, kind Workload: shapes with "
            "gpuMilli, gpuCount, gpuTypes, cpuMilli, memoryMiB, weight); without it the extender "
            "learns the mix from the pods it sees (GET /workload shows it)"
        ),
    )
    parser.add_argument(
        "--shortlist",
        type=int,
        default=DEFAULT_KEEP,
        metavar="N",
        help=(
            f"filter passes at most N fitting nodes, those prioritize ranks best (fuller nodes first "
            f"among equals), so kube-scheduler scores N nodes instead of all; pods with soft "
            f"preferences (preferred affinity, ScheduleAnyway spread) always get every fitting node; "
            f"0 passes every fitting node (default {DEFAULT_KEEP})"
        ),
    )
    parser.add_argument(
        "--gang-ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help=(
            "how long the devices planned for a gang's members stay held for them after the first "
            "member is filtered (members that bind take theirs over; the rest are released then); "
            f"0 turns gang placement off (default {DEFAULT_TTL_S:g})"
        ),
    )
    parser.add_argument(
        "--network-tier-labels",
        default=",".join(DEFAULT_TIER_LABELS),
        metavar="LABEL,LABEL,...",
        help=(
            "node labels naming network domains, closest first: a gang goes to the closest tier "
            f"where one domain holds it all (default {','.join(DEFAULT_TIER_LABELS)})"
        ),
    )
    parser.add_argument(
        HOLD_LIMIT_FLAG,
        default=f"{DEFAULT_HOLD_SHARE:.0%}",
        metavar="GPUS|PERCENT%",
        help=(
            "the most GPUs the places held for one namespace's gangs (members not bound yet) may "
            "take together: a number of GPUs, or a percentage of the GPUs of the nodes with an "
            f"inventory (never below {PERCENT_FLOOR_GPUS} GPUs); a gang whose plan would go past it "
            f"holds nothing and waits (default {DEFAULT_HOLD_SHARE:.0%}%)"  # %%: argparse formats help
        ),
    )
    parser.add_argument(
        "--gang-preflight",
        choices=("agent", "off"),
        default="agent",
        help=(
            "before a multi-node gang starts, each member node's agent checks the GPUs planned there "
            "(host<->device and NVLink copies) through a GpuPreflight object; a node that fails is "
            "marked by its agent and the gang is planned elsewhere. Nodes whose agent does not serve "
            "preflights (no gpuweave.io/preflight=agent label) are not asked (default agent)"
        ),
    )
    parser.add_argument(
        "--gang-preflight-checks",
        choices=("bandwidth", "full"),
        default="bandwidth",
        help=(
            "what a member node's agent runs: bandwidth (host<->device and NVLink copies: what a "
            "multi-node job leans on; seconds) or full (memory pattern and compute kernel too) "
            "(default bandwidth)"
        ),
    )
    parser.add_argument(
        "--gang-preflight-timeout",
        type=float,
        default=TIMEOUT_S,
        metavar="SECONDS",
        help=(
            "a preflight not answered within this long counts as failed; at most half of --gang-ttl, "
            f"which the plan waiting for it lives by (default {TIMEOUT_S:g})"
        ),
    )
    parser.add_argument(
        "--gang-preflight-fresh",
        type=float,
        default=FRESH_S,
        metavar="SECONDS",
        help=f"GPUs that passed a preflight this recently are not asked again (default {FRESH_S:g})",
    )
    _tier_wait_flags(parser)
    _leader_flags(parser)
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    parser.set_defaults(handler=run)


def _leader_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "run the controllers (the Kueue admission check, the sweep of stale GpuPreflight objects) "
            "only while this replica holds a coordination.k8s.io Lease, so two replicas never both "
            "write; filter, prioritize and bind are served either way (default on)"
        ),
    )
    parser.add_argument(
        "--leader-elect-namespace",
        metavar="NAMESPACE",
        help="namespace of the Lease (default $POD_NAMESPACE, else the service account's, else default)",
    )
    parser.add_argument(
        "--leader-elect-name",
        default=DEFAULT_LEASE_NAME,
        metavar="NAME",
        help=f"the Lease (default {DEFAULT_LEASE_NAME})",
    )
    parser.add_argument(
        "--leader-elect-identity",
        metavar="ID",
        help="this replica's name in the Lease; unique per replica (default $POD_NAME, else the host name)",
    )
    parser.add_argument(
        "--leader-elect-lease-duration",
        type=float,
        default=DEFAULT_DURATION_S,
        metavar="SECONDS",
        help=(
            "a standby takes the Lease once its holder has not renewed it for this long, by the "
            f"standby's own clock (default {DEFAULT_DURATION_S})"
        ),
    )
    parser.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=DEFAULT_RETRY_S,
        metavar="SECONDS",
        help=(
            "how often the holder renews and a standby looks; a holder that could not renew for the "
            f"lease duration minus this stops acting (default {DEFAULT_RETRY_S:g})"
        ),
    )


def _lease(args: argparse.Namespace) -> LeaseSettings:
    return lease_settings(
        enabled=args.leader_elect,
        namespace=args.leader_elect_namespace,
        name=args.leader_elect_name,
        identity=args.leader_elect_identity,
        duration_s=args.leader_elect_lease_duration,
        retry_s=args.leader_elect_retry_period,
    )


def _listen_address(text: str, *, flag: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InvalidInputError(f"{flag} {text!r} is not HOST:PORT; for example 0.0.0.0:8888")
    return host.strip("[]") or "0.0.0.0", int(port)


def _tier_wait_flags(parser: argparse.ArgumentParser) -> None:
    """A gang whose tightest network tier is busy waits for it, or takes a looser one now."""
    parser.add_argument(
        "--gang-expected-duration",
        default=f"{DEFAULT_JOB_DURATION_S:.0f}",
        metavar="DURATION",
        help=(
            "how long a job runs when its pod gives no gpuweave.io/expected-duration (4h, 90m, or "
            "seconds; a shorter activeDeadlineSeconds wins): what a gang weighs a wait for its tightest "
            f"network tier against (default {DEFAULT_JOB_DURATION_S:.0f} s)"
        ),
    )
    parser.add_argument(
        "--gang-tier-stretch",
        type=float,
        default=DEFAULT_STRETCH_PER_STEP,
        metavar="FACTOR",
        help=(
            "how much longer a gang's job runs per network tier step looser than its tightest one "
            "(1..10); a gang waits for the tightest tier when the expected wait is less than "
            f"(stretch - 1) x its expected duration; 1 never waits (default {DEFAULT_STRETCH_PER_STEP:g})"
        ),
    )
    parser.add_argument(
        "--gang-max-tier-wait",
        default=f"{DEFAULT_MAX_WAIT_S:.0f}",
        metavar="DURATION",
        help=(
            "the longest a gang waits for its tightest tier (4h, 90m, or seconds; 0 never waits); "
            f"past it the gang takes the looser tier (default {DEFAULT_MAX_WAIT_S:.0f} s)"
        ),
    )


def _tier_cost_settings(args: argparse.Namespace) -> TierCostSettings:
    try:
        default_s = parse_expected_duration(args.gang_expected_duration, what="--gang-expected-duration")
        max_wait = str(args.gang_max_tier_wait).strip()
        max_wait_s = (
            0.0 if max_wait == "0" else parse_expected_duration(max_wait, what="--gang-max-tier-wait")
        )
    except BadGangError as exc:
        raise InvalidInputError(str(exc)) from exc
    return TierCostSettings(
        default_duration_s=default_s, stretch_per_step=args.gang_tier_stretch, max_wait_s=max_wait_s
    )


def _gang_settings(args: argparse.Namespace) -> GangSettings:
    if not 0 <= args.gang_ttl <= 3600:  # NaN fails both comparisons
        raise InvalidInputError(f"--gang-ttl {args.gang_ttl} is outside 0..3600 seconds; 0 turns gangs off")
    timeout_s, fresh_s = args.gang_preflight_timeout, args.gang_preflight_fresh
    for flag, value in (("--gang-preflight-timeout", timeout_s), ("--gang-preflight-fresh", fresh_s)):
        if not 0 < value <= 86400:
            raise InvalidInputError(f"{flag} {value} is outside (0, 86400] seconds")
    return GangSettings(
        ttl_s=args.gang_ttl,
        tier_labels=parse_tier_labels(args.network_tier_labels),
        hold_limit=HoldLimit.parse(args.gang_hold_per_namespace),
        tier_cost=_tier_cost_settings(args),
        preflight=PreflightSettings(
            check=args.gang_preflight,
            checks=args.gang_preflight_checks,
            timeout_s=min(timeout_s, args.gang_ttl / 2 or timeout_s),  # inside the plan's reservation
            fresh_s=fresh_s,
        ),
    )


def _build(args: argparse.Namespace) -> Extender:
    workload = load_workload_file(Path(args.workload)) if args.workload else None
    if args.shortlist < 0:
        raise InvalidInputError(f"--shortlist {args.shortlist} is negative; give 0 (every node) or a count")
    gangs = _gang_settings(args)
    if args.snapshot:
        return build_snapshot_extender(
            Path(args.snapshot), workload=workload, keep=args.shortlist, gangs=gangs
        )
    if args.kubeconfig or args.in_cluster:
        return build_kube_extender(
            kubeconfig=args.kubeconfig,
            workload=workload,
            keep=args.shortlist,
            gangs=gangs,
            lease=_lease(args),
        )
    raise InvalidInputError("give --kubeconfig FILE, --in-cluster or --snapshot FILE")


def _freeze_when_synced(extender: Extender, stop: threading.Event) -> None:
    """Move the loaded cache out of the collector's sight once synced: a full GC pass over tens
    of thousands of node states would otherwise land in some request's latency."""
    while not stop.is_set():
        if extender.cache.synced.wait(timeout=1.0):
            gc.freeze()
            return


def _serve(extender: Extender, args: argparse.Namespace) -> str:
    """Bind the protocol listener and, with --probe-listen, the probe listener; one-line errors."""
    host, port = _listen_address(args.listen)
    probe = _listen_address(args.probe_listen, flag="--probe-listen") if args.probe_listen else None
    flag, address = "--listen", args.listen
    try:
        url = extender.serve(
            host=host,
            port=port,
            tls_cert=Path(args.tls_cert) if args.tls_cert else None,
            tls_key=Path(args.tls_key) if args.tls_key else None,
        )
        if probe is None:
            return url
        flag, address = "--probe-listen", args.probe_listen
        return f"{url}, probes on {extender.serve_probes(host=probe[0], port=probe[1])}"
    except OSError as exc:
        extender.close()
        raise GpuweaveError(f"cannot serve on {address}: {exc.strerror}; pick another {flag}") from None
    except GpuweaveError:
        extender.close()
        raise


def run(args: argparse.Namespace) -> int:
    _listen_address(args.listen)
    if args.probe_listen:
        _listen_address(args.probe_listen, flag="--probe-listen")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InvalidInputError("--tls-cert and --tls-key go together; give both or neither")
    extender = _build(args)
    urls = _serve(extender, args)
    stop = stop_on_signals()
    cached = len(extender.cache.node_names())
    print(f"gpuweave extender serving on {urls} ({cached} nodes cached)", flush=True)
    threading.Thread(target=_freeze_when_synced, args=(extender, stop), daemon=True).start()
    try:
        wait_for(stop)
    finally:
        extender.close()
    return 0
