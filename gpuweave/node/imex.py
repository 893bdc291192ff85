"""IMEX for the node agent: the node's IMEX daemon configured for the job that holds its channel.

``ImexReconciler`` follows one source of the node's domain (``ImexSource``): in device-plugin mode
the agent's pod view (``deviceplugin.kube.PodWatcher``; ``PodImexSource``: the pod that asks for the
channel, ``nodeagent.imex``), in DRA mode the GpuImexDomain the channel's claim joined
(``dradriver.imex_domains.NodeImexDomains``: its status entries of this node's clique). Whenever
the source changes, and every ``interval_s`` while a domain is incomplete, it asks the source which
domain the node should serve, looks up the InternalIPs of the nodes in this node's clique (one
``list nodes`` by the clique label, ``deviceplugin.kube.clique_peers``), and hands the result to
``ImexConfigWriter`` (one per node, whichever the mode):

- ``nodes_config.cfg``: one peer address per line, what ``nvidia-imex`` reads
  (``/etc/nvidia-imex/nodes_config.cfg`` on a host; ``--imex-config-dir`` points the agent there);
- ``gpuweave-domain.json``: the domain, its nodes and addresses, the pod (or claim) that holds the
  channel, and whether a daemon serves it (``simulated: true`` when the agent runs on simulated
  hardware, where this file is the simulated daemon's state).

Both are replaced atomically and removed when no pod (or claim) holds the channel any more (the
domain is torn down with the job). Restarting a host's ``nvidia-imex`` service after a change is
left to the host (docs/nvlink-domains.md, IMEX). A peer whose InternalIP is not exactly one IP
address (``nodeagent.imex.peer_address``), repeats another's, or comes past the largest NVLink
domain is left out of the file, logged, and counted (``gpuweave_imex_peers_left_out``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge

from devicemodel.state_file import replace_file_atomically
from deviceplugin.handoff import PodView
from deviceplugin.imex_pods import wanted_domain
from nodeagent.imex import ImexConfig, ImexDecision, ImexPlan, LeftOut, imex_config

log = logging.getLogger(__name__)
NODES_CONFIG = "nodes_config.cfg"
DOMAIN_FILE = "gpuweave-domain.json"
DEFAULT_INTERVAL_S = 10.0
_STEP_S = 0.5


class ImexMetrics:
    """The reconciler's metric, on the agent's registry: the nodes of the served domain that its
    ``nodes_config.cfg`` leaves out, per reason (``nodeagent.imex.LeftOut``), as of the last round."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.left_out = Gauge(
            "gpuweave_imex_peers_left_out",
            "Nodes of the IMEX domain the node serves left out of nodes_config.cfg, per reason: "
            "not-in-clique, not-an-address, duplicate-address, over-cap",
            ["reason"],
            registry=registry,
        )

    def record(self, counts: dict[LeftOut, int]) -> None:
        for why, count in counts.items():
            self.left_out.labels(why.value).set(count)


class ImexConfigWriter:
    """Writes (or removes) the daemon's node list and gpuweave's record of the domain."""

    def __init__(self, directory: Path, *, simulated: bool) -> None:
        self.directory = directory
        self._simulated = simulated

    def apply(self, config: ImexConfig | None, *, holder: str = "") -> None:
        if config is None:
            for name in (NODES_CONFIG, DOMAIN_FILE):
                (self.directory / name).unlink(missing_ok=True)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {
            "domain": config.domain,
            "nodes": list(config.nodes),
            "addresses": list(config.addresses),
            "holder": holder,
            "simulated": self._simulated,
        }
        replace_file_atomically(self.directory / NODES_CONFIG, config.nodes_config().encode())
        replace_file_atomically(self.directory / DOMAIN_FILE, (json.dumps(record, indent=1) + "\n").encode())

    def current(self) -> dict[str, Any] | None:
        try:
            loaded = json.loads((self.directory / DOMAIN_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None


class ImexSource(Protocol):
    """Where the node's domain comes from: a version that moves on every change, and the decision."""

    def version(self) -> int: ...

    def wait_for_change(self, version: int, *, timeout: float) -> bool: ...

    def decide(self, *, node: str, clique: str | None) -> ImexDecision: ...


class PodImexSource:
    """Device-plugin mode: the pod on the node that asks for the channel names the domain."""

    def __init__(self, view: PodView) -> None:
        self._view = view

    def version(self) -> int:
        return self._view.version()

    def wait_for_change(self, version: int, *, timeout: float) -> bool:
        return self._view.wait_for_change(version, timeout=timeout)

    def decide(self, *, node: str, clique: str | None) -> ImexDecision:
        return wanted_domain(self._view.assigned(), node=node)


class ImexReconciler:
    """Keeps the writer's files equal to the domain the node's channel holder asks for."""

    def __init__(
        self,
        source: PodView | ImexSource,
        *,
        node: str,
        clique: Callable[[], str | None],
        peers: Callable[[str], dict[str, str]],
        writer: ImexConfigWriter,
        interval_s: float = DEFAULT_INTERVAL_S,
        metrics: ImexMetrics | None = None,
    ) -> None:
        self._source: ImexSource = PodImexSource(source) if isinstance(source, PodView) else source
        self._node = node
        self._clique = clique
        self._peers = peers
        self._writer = writer
        self._interval_s = interval_s
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._applied: tuple[ImexConfig | None, str] | None = None
        self._reported = ""
        self.problem = ""  # the last problem seen ("" when the domain was configured whole)
        self.left_out: dict[LeftOut, int] = ImexPlan(None).counts()  # of the last round, per reason

    def reconcile(self) -> ImexConfig | None:
        """One round: decide, look up peers, write when it differs from what was written."""
        clique = self._clique()
        decision = self._source.decide(node=self._node, clique=clique)
        plan = ImexPlan(None)
        if decision.domain is not None:
            peers = self._peers(clique) if clique is not None else {}
            plan = imex_config(decision.domain, node=self._node, clique=clique, peers=peers)
        config, problem = plan.config, "; ".join(p for p in (decision.problem, plan.problem) if p)
        self.left_out = plan.counts()
        if self._metrics is not None:
            self._metrics.record(self.left_out)
        if (config, decision.holder) != self._applied:
            self._writer.apply(config, holder=decision.holder)
            self._applied = (config, decision.holder)
            if config is not None:
                holder, count = decision.holder, len(config.nodes)
                log.info("IMEX domain %s for %s: %d node(s)", config.domain, holder, count)
            else:
                log.info("IMEX: no domain on node %s", self._node)
        if problem and problem != self._reported:
            log.warning("%s", problem)
        self._reported = self.problem = problem
        return config

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="imex-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        """Reconcile on every change of the source, and every ``interval_s`` while a domain is
        incomplete (a peer's address may appear later); waits in short steps so ``stop`` is quick."""
        version, waited = -1, 0.0
        while not self._stop.is_set():
            current = self._source.version()
            if current != version or (self.problem and waited >= self._interval_s):
                version, waited = current, 0.0
                try:
                    self.reconcile()
                except Exception as exc:  # an API or disk error: keep what was written, retry later
                    log.exception("IMEX reconcile failed; retrying in %.0f s", self._interval_s)
                    self.problem = f"IMEX reconcile failed: {exc}"
            if not self._source.wait_for_change(current, timeout=_STEP_S):
                waited += _STEP_S
