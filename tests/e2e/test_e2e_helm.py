"""The Helm chart (manifests/helm/gpuweave), rendered by Helm's own engine (tests/e2e/opscheck):
its defaults are the kustomize base, object for object; it applies to the real kube-apiserver; and
its values reach the node agent's and the scheduler's real flags and configuration files."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import dynamic

from devicemodel.sharing import SharingConfigModel
from gpuweave.cli import build_parser
from gpuweave.node.health import load_settings
from tests.e2e.cluster import NAMESPACE, REPO, ControlPlane, harness_binary
from tests.support.opscheck import RenderError, is_hook, render_chart

pytestmark = pytest.mark.e2e

Key = tuple[str, str, str | None, str]
MONITORING = REPO / "manifests" / "monitoring"


def _by_key(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    keyed = {
        (d["apiVersion"], d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
    }
    assert len(keyed) == len(docs), "two objects with one identity"
    return keyed


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(harness_binary()), "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _one(docs: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


def _agent_args(docs: list[dict[str, Any]]) -> list[str]:
    return list(_one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"])


def test_helm_defaults_render_the_kustomize_base() -> None:
    chart = _by_key(render_chart())
    base = _by_key(_kustomize(REPO / "manifests"))
    assert sorted(chart, key=str) == sorted(base, key=str)
    for key, obj in base.items():
        assert chart[key] == obj, f"{key} differs between the chart and the kustomize base"


def test_helm_defaults_apply_to_the_api_server_as_no_change(plane: ControlPlane) -> None:
    """The session's cluster holds the kustomize base; applying the chart's default objects with the
    same field manager writes nothing (no object's resourceVersion moves)."""
    docs = render_chart()
    dyn = dynamic.DynamicClient(plane.api)  # type: ignore[no-untyped-call]

    def versions() -> dict[Key, str]:
        found = {}
        for key in _by_key(docs):
            api_version, kind, namespace, name = key
            obj = dyn.resources.get(api_version=api_version, kind=kind).get(name=name, namespace=namespace)
            found[key] = obj.metadata.resourceVersion
        return found

    before = versions()
    plane.apply(docs)
    assert versions() == before


def test_helm_mig_demand_mode_shows_in_the_daemonset() -> None:
    base = _by_key(render_chart())
    demand = _by_key(render_chart(sets=["nodeAgent.mig.mode=demand"]))
    agent = ("apps/v1", "DaemonSet", NAMESPACE, "gpuweave-node-agent")
    assert _agent_args([demand[agent]]) == [*_agent_args([base[agent]]), "--mig-demand"]
    added = set(demand) - set(base)
    assert {(kind, name) for _, kind, _, name in added} == {
        ("ClusterRole", "gpuweave-node-agent-mig-demand"),
        ("ClusterRoleBinding", "gpuweave-node-agent-mig-demand"),
    }
    base_rbac = _by_key(_kustomize_file(REPO / "manifests" / "rbac-node-agent-mig-demand.yaml"))
    assert {key: demand[key] for key in added} == base_rbac
    assert all(demand[key] == base[key] for key in base if key != agent)


def test_helm_kueue_admission_check_is_the_one_the_extender_serves() -> None:
    from scheduler_ext.kueue.checks import CONTROLLER_NAME  # noqa: PLC0415

    base = _by_key(render_chart())
    kueue = _by_key(render_chart(sets=["kueue.admissionCheck.create=true", "kueue.admissionCheck.name=gpus"]))
    added = set(kueue) - set(base)
    assert added == {("kueue.x-k8s.io/v1beta2", "AdmissionCheck", None, "gpus")}
    [check] = [kueue[key] for key in added]
    assert check["spec"] == {"controllerName": CONTROLLER_NAME}
    policy = (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        None,
        "gpuweave-kueue-workload-status",
    )
    assert [key for key in base if kueue[key] != base[key]] == [policy]  # it lists the chart's check
    [checks] = [v["expression"] for v in kueue[policy]["spec"]["variables"] if v["name"] == "checks"]
    assert checks == "['gpus']"
    with pytest.raises(RenderError):
        render_chart(sets=["kueue.admissionCheck.name=Not_A_Name"])


def test_helm_mig_off_mode_shows_in_the_daemonset_and_the_agent_reads_it() -> None:
    from gpuweave.cli import build_parser  # noqa: PLC0415
    from gpuweave.commands.node_agent import mig_mode  # noqa: PLC0415

    base = _by_key(render_chart())
    off = _by_key(render_chart(sets=["nodeAgent.mig.mode=off"]))
    agent = ("apps/v1", "DaemonSet", NAMESPACE, "gpuweave-node-agent")
    args = _agent_args([off[agent]])
    assert args == [*_agent_args([base[agent]]), "--mig-mode=off"]
    assert set(off) == set(base) and all(off[key] == base[key] for key in base if key != agent)
    assert mig_mode(build_parser().parse_args(args)) == "off"  # the agent's own parser reads them


def _kustomize_file(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_helm_schema_refuses_an_unknown_mig_mode_and_tls_without_a_secret() -> None:
    with pytest.raises(RenderError, match=r"declared.*demand"):
        render_chart(sets=["nodeAgent.mig.mode=dynamic"])
    with pytest.raises(RenderError, match=r"tls\.secretName"):
        render_chart(sets=["scheduler.extender.tls.enabled=true"])
    with pytest.raises(RenderError, match="additional properties"):
        render_chart(sets=["nodeAgent.sharng.default.mode=fractional"])
    with pytest.raises(RenderError, match="gangTtlSeconds"):
        render_chart(sets=["scheduler.extender.gangTtlSeconds=-1"])
    with pytest.raises(RenderError, match="gangHoldPerNamespace"):
        render_chart(sets=["scheduler.extender.gangHoldPerNamespace=0%"])


OPERATOR_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example/gpuweave", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "nodeAgent": {
        # Helm merges maps with the chart's default: null drops the default key.
        "nodeSelector": {"nvidia.com/gpu.present": "true", "gpuweave.io/gpu-node": None},
        "kubeletRoot": "/var/lib/k0s/kubelet",
        "runtimeClassName": "",
        "sharing": {
            "default": {"mode": "exclusive"},
            "gpus": {
                "6": {"mode": "fractional", "mps": {"defaultActiveThreadPercentage": 50}},
                "7": {"mode": "time-sliced", "replicas": 4},
            },
        },
        "health": {"round_interval_s": 5, "eviction_grace_s": 60},
        "mig": {"mode": "demand"},
        "correctAssignments": True,
        "deviceListStrategy": "cdi-cri",
        "metrics": {"enabled": True, "port": 9402},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    },
    "scheduler": {
        "replicas": 1,
        "extender": {
            "weight": 7,
            "tls": {"enabled": True, "secretName": "gpuweave-extender-tls"},
            "gangTtlSeconds": 120,
            "networkTierLabels": ["nvidia.com/gpu.clique", "example.com/ib-leaf"],
            "gangHoldPerNamespace": "25%",
            "claims": {"enabled": True},
        },
        "probeNetworkPolicy": {
            "enabled": True,
            "metricsFrom": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ],
            "nodeCIDRs": ["10.0.0.0/16", "fd00:10::/64"],
        },
    },
}


def test_helm_values_reach_the_agents_flags_and_config_files(tmp_path: Path) -> None:
    docs = render_chart(OPERATOR_VALUES, work=tmp_path)
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and "runtimeClassName" not in pod
    assert (container["image"], container["imagePullPolicy"]) == (
        "registry.example/gpuweave:0.1.0-rc1",
        "Always",
    )
    args = build_parser().parse_args(container["args"])  # the real CLI accepts every flag the chart sets
    assert (args.mig_demand, args.correct_assignments, args.metrics_address) == (True, True, "0.0.0.0:9402")
    assert args.device_list_strategy == "cdi-cri" and args.in_cluster
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["device-plugins"] == "/var/lib/k0s/kubelet/device-plugins"
    assert host_paths["pod-resources"] == "/var/lib/k0s/kubelet/pod-resources"

    files = _one(docs, "ConfigMap", "gpuweave-node-agent-config")["data"]
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["config"]
    assert str(args.sharing_config) == f"{mount}/sharing-config.yaml"
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    sharing = SharingConfigModel.model_validate(yaml.safe_load(files["sharing-config.yaml"]))
    assert sharing.gpus["7"].replicas == 4 and sharing.mps_pipe_directory == host_paths["mps"]
    assert load_settings(tmp_path / "health-config.yaml").eviction_grace_s == 60
    assert (
        "checksum/node-agent-config" in _one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    )
    roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
    assert {"gpuweave-node-agent-mig-demand", "gpuweave-node-agent-assignments"} <= roles


def test_helm_values_reach_the_scheduler_configuration(tmp_path: Path) -> None:
    docs = render_chart(OPERATOR_VALUES, work=tmp_path)
    config_map = _one(docs, "ConfigMap", "gpuweave-scheduler-config-")
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    extender = config["extenders"][0]
    assert (extender["weight"], extender["urlPrefix"], extender["enableHTTPS"]) == (
        7,
        "https://127.0.0.1:8888",
        True,
    )
    assert extender["tlsConfig"] == {"caFile": "/etc/gpuweave-extender-tls/ca.crt"}
    base = yaml.safe_load((REPO / "manifests" / "scheduler" / "scheduler-config.yaml").read_text())
    assert {
        k: v for k, v in extender.items() if k not in ("weight", "urlPrefix", "enableHTTPS", "tlsConfig")
    } == {k: v for k, v in base["extenders"][0].items() if k not in ("weight", "urlPrefix", "enableHTTPS")}
    (claims,) = config["extenders"][1:]  # claims.enabled appended the claims entry, over HTTPS too
    (shipped,) = yaml.safe_load((REPO / "manifests" / "scheduler" / "claims-extender.yaml").read_text())
    assert (claims["prioritizeVerb"], claims["weight"], claims["urlPrefix"]) == (
        "prioritize-claims",
        shipped["weight"],
        "https://127.0.0.1:8888",
    )
    assert claims["enableHTTPS"] is True and claims["tlsConfig"] == extender["tlsConfig"]
    deployment = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert deployment["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    containers = {c["name"]: c for c in deployment["containers"]}
    args = build_parser().parse_args(containers["extender"]["args"])
    assert (args.tls_cert, args.tls_key) == (
        "/etc/gpuweave-extender-tls/tls.crt",
        "/etc/gpuweave-extender-tls/tls.key",
    )
    assert (args.gang_ttl, args.network_tier_labels) == (120.0, "nvidia.com/gpu.clique,example.com/ib-leaf")
    assert args.gang_hold_per_namespace == "25%"
    for name in ("kube-scheduler", "extender"):
        assert {
            "name": "extender-tls",
            "mountPath": "/etc/gpuweave-extender-tls",
            "readOnly": True,
        } in containers[name]["volumeMounts"]


def test_helm_probe_network_policy_lets_only_the_scraper_and_nodes_reach_the_probe_port(
    tmp_path: Path,
) -> None:
    docs = render_chart(OPERATOR_VALUES, work=tmp_path)
    policy = _one(docs, "NetworkPolicy", "gpuweave-scheduler-probes")
    deployment = _one(docs, "Deployment")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= deployment["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    extender = {c["name"]: c for c in deployment["spec"]["containers"]}["extender"]
    probe_port = {p["name"]: p["containerPort"] for p in extender["ports"]}["probes"]
    assert rule["ports"] == [{"protocol": "TCP", "port": probe_port}]
    scraper = OPERATOR_VALUES["scheduler"]["probeNetworkPolicy"]["metricsFrom"][0]
    nodes = [{"ipBlock": {"cidr": "10.0.0.0/16"}}, {"ipBlock": {"cidr": "fd00:10::/64"}}]
    assert rule["from"] == [scraper, *nodes]
    only_probes = render_chart(sets=["scheduler.probeNetworkPolicy.enabled=true"])
    assert _one(only_probes, "NetworkPolicy")["spec"]["ingress"] == []  # the node's probes only
    assert not [d for d in render_chart() if d["kind"] == "NetworkPolicy"]  # off by default, as the base
    with pytest.raises(RenderError, match="nodeCIDRs"):
        render_chart(sets=["scheduler.probeNetworkPolicy.nodeCIDRs={10.0.0.1}"])
    with pytest.raises(RenderError, match="additional properties"):
        render_chart(sets=["scheduler.probeNetworkPolicy.metricsFrom[0].namespace=monitoring"])


def test_helm_values_render_objects_the_api_server_accepts(plane: ControlPlane, tmp_path: Path) -> None:
    """Server-side apply as a dry run: validated and defaulted by kube-apiserver, nothing stored (the
    session's cluster keeps the base the other tests run against)."""
    docs = render_chart(OPERATOR_VALUES, work=tmp_path)
    dyn = dynamic.DynamicClient(plane.api)  # type: ignore[no-untyped-call]
    accepted = []
    for doc in docs:
        ControlPlane.apply_one(dyn, doc, manager="gpuweave-e2e-helm", dry_run=True)
        accepted.append(doc["kind"])
    assert {"DaemonSet", "Deployment", "NetworkPolicy"} <= set(accepted)
    agent = dyn.resources.get(api_version="apps/v1", kind="DaemonSet").get(
        name="gpuweave-node-agent", namespace=NAMESPACE
    )
    assert "--mig-demand" not in agent.spec.template.spec.containers[0].args  # the dry run stored nothing


def test_helm_monitoring_objects_carry_the_monitoring_files(tmp_path: Path) -> None:
    values = {
        "nodeAgent": {"metrics": {"enabled": True}},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
            "dashboard": {"enabled": True},
        },
    }
    docs = render_chart(values, work=tmp_path)
    rule = _one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((MONITORING / "gpuweave-alerts.yaml").read_text())["spec"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    dashboard = _one(docs, "ConfigMap", "gpuweave-grafana-dashboard")
    assert dashboard["data"]["gpuweave.json"] == (MONITORING / "gpuweave-dashboard.json").read_text()
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"gpuweave-scheduler", "gpuweave-node-agent"}
    services = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
    agent_port = {
        p["name"]: p for p in _one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert (
        services["gpuweave-node-agent-metrics"]["ports"][0]["targetPort"] == "metrics"
        and "metrics" in agent_port
    )
    relabel = monitors["gpuweave-node-agent"]["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    kustomized = _by_key(_kustomize(MONITORING))
    assert {k[1] for k in kustomized} == {"PrometheusRule", "ConfigMap"}


def _monitoring_kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    wanted = {"ServiceMonitor", "PrometheusRule"}
    return {
        (d["kind"], d["metadata"]["name"])
        for d in docs
        if d["kind"] in wanted or d["metadata"]["name"].endswith(("-metrics", "-grafana-dashboard"))
    }


def test_helm_one_monitoring_value_turns_on_metrics_and_what_reads_them() -> None:
    """monitoring.enabled alone: the agents serve /metrics and every object that reads them is
    there; the dashboard and the ServiceMonitor without nodeAgent.metrics (the values that used to
    leave the health panels and alerts empty) now turn the agents' metrics on too."""
    everything = {
        ("Service", "gpuweave-scheduler-metrics"),
        ("ServiceMonitor", "gpuweave-scheduler"),
        ("Service", "gpuweave-node-agent-metrics"),
        ("ServiceMonitor", "gpuweave-node-agent"),
        ("PrometheusRule", "gpuweave"),
        ("ConfigMap", "gpuweave-grafana-dashboard"),
    }
    one = render_chart(sets=["monitoring.enabled=true"])
    assert _monitoring_kinds(one) == everything
    assert "--metrics-address=0.0.0.0:9402" in _agent_args(one)
    parts = render_chart(sets=["monitoring.serviceMonitor.enabled=true", "monitoring.dashboard.enabled=true"])
    assert _monitoring_kinds(parts) == everything - {("PrometheusRule", "gpuweave")}
    assert "--metrics-address=0.0.0.0:9402" in _agent_args(parts)
    rule_only = render_chart(sets=["monitoring.prometheusRule.enabled=true", "nodeAgent.metrics.port=9500"])
    assert "--metrics-address=0.0.0.0:9500" in _agent_args(rule_only)
    agent_only = render_chart(sets=["nodeAgent.metrics.enabled=true"])  # as before: no scrape objects
    assert _monitoring_kinds(agent_only) == set()
    assert "--metrics-address=0.0.0.0:9402" in _agent_args(agent_only)
    assert "--metrics-address=0.0.0.0:9402" not in _agent_args(render_chart())


def test_helm_log_level_in_extra_args_reaches_a_parser_that_takes_it() -> None:
    docs = render_chart(sets=["nodeAgent.extraArgs={--log-level=INFO}"])
    args = _agent_args(docs)
    assert args[-1] == "--log-level=INFO"
    assert build_parser().parse_args(args).log_level == "INFO"


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("nodeAgent.health.round_intervl_s=5", "round_intervl_s"),
        ("nodeAgent.health.active_checks.burnin_level=2", "burnin_level"),
        ("nodeAgent.health.eviction_grace_s=-1", "eviction_grace_s"),
        ("nodeAgent.sharing.default.mod=fractional", "mod"),
        ("nodeAgent.sharing.default.mode=mps", "mode"),
        ("nodeAgent.sharing.gpus.7.replica=4", "replica"),
        ("nodeAgent.sharing.default.mps.activeThreadPercentage=50", "activeThreadPercentage"),
        ("nodeAgent.sharingConfigs.inference.default.mode=fractionl", "mode"),
        ("nodeAgent.sharingConfigs.bad/name.default.mode=fractional", "bad/name"),
    ],
)
def test_helm_schema_refuses_what_the_agent_would_refuse_at_start(setting: str, named: str) -> None:
    """Before, anything under nodeAgent.health and the sharing entries rendered, and every agent
    then refused its configuration file at start."""
    with pytest.raises(RenderError, match=named):
        render_chart(sets=[setting])


def test_helm_named_sharing_configs_reach_the_agent_by_node_label(tmp_path: Path) -> None:
    from gpuweave.node.sharing import chosen_sharing_config  # noqa: PLC0415

    values = {
        "nodeAgent": {
            "sharing": {"default": {"mode": "exclusive"}},
            "sharingConfigs": {
                "inference": {"default": {"mode": "fractional"}},
                "notebooks": {"default": {"mode": "time-sliced", "replicas": 8}},
            },
        }
    }
    docs = render_chart(values, work=tmp_path)
    named = _one(docs, "ConfigMap", "gpuweave-node-agent-sharing")["data"]
    assert set(named) == {"inference.yaml", "notebooks.yaml"}
    pod = _one(docs, "DaemonSet")["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["spec"]["volumes"]}
    assert str(args.sharing_config_dir) == mounts["sharing-configs"] == "/etc/gpuweave/sharing"
    assert volumes["sharing-configs"] == "gpuweave-node-agent-sharing"
    assert "checksum/node-agent-sharing" in pod["metadata"]["annotations"]
    directory = tmp_path / "sharing"
    directory.mkdir()
    for name, text in named.items():
        (directory / name).write_text(text)
        SharingConfigModel.model_validate(yaml.safe_load(text))  # what the agent reads at start
    args.sharing_config_dir = directory

    def labelled(value: str | None) -> dict[str, str]:
        return {} if value is None else {"gpuweave.io/sharing-config": value}

    chosen = chosen_sharing_config(args, labels=lambda: labelled("notebooks"))
    assert chosen == directory / "notebooks.yaml"
    assert SharingConfigModel.model_validate(yaml.safe_load(chosen.read_text())).default.replicas == 8
    assert chosen_sharing_config(args, labels=lambda: labelled(None)) == args.sharing_config
    assert not [d for d in render_chart() if d["metadata"]["name"] == "gpuweave-node-agent-sharing"]


def test_helm_scheduler_replicas_spread_keep_one_up_and_elect_one_extender(tmp_path: Path) -> None:
    """Defaults: preferred anti-affinity by host, a PDB of at most one down, the extender's Lease
    flags; antiAffinity required, an affinity of one's own, the budget and the election turned off."""
    docs = render_chart()
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    (preferred,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    budget = _one(docs, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"] == _one(docs, "Deployment")["spec"]["selector"]
    extender = {c["name"]: c for c in pod["containers"]}["extender"]
    args = build_parser().parse_args(extender["args"])
    assert (args.leader_elect, args.leader_elect_lease_duration, args.leader_elect_retry_period) == (
        True,
        15,
        5,
    )
    assert {e["name"] for e in extender["env"]} == {"POD_NAME", "POD_NAMESPACE"}

    values = {
        "scheduler": {
            "antiAffinity": "required",
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
            },
            "podDisruptionBudget": {"enabled": False},
            "extender": {"leaderElection": {"enabled": False}},
        }
    }
    docs = render_chart(values, work=tmp_path)
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert set(pod["affinity"]) == {"nodeAffinity", "podAntiAffinity"}
    assert "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    extender = {c["name"]: c for c in pod["containers"]}["extender"]
    assert build_parser().parse_args(extender["args"]).leader_elect is False

    own = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    docs = render_chart({"scheduler": {"affinity": own}}, work=tmp_path)
    assert _one(docs, "Deployment")["spec"]["template"]["spec"]["affinity"] == own


def test_helm_refuses_a_lease_whose_leader_cannot_miss_a_renewal() -> None:
    with pytest.raises(RenderError, match="retryPeriodSeconds"):
        render_chart(sets=["scheduler.extender.leaderElection.retryPeriodSeconds=6"])
    with pytest.raises(RenderError, match="antiAffinity"):
        render_chart(sets=["scheduler.antiAffinity=sometimes"])


def test_helm_uninstall_hook_runs_gpuweave_uninstall_with_the_rights_it_uses() -> None:
    """The pre-delete hook: a Job whose arguments the real CLI parses, run by a service account whose
    RBAC grants what ``gpuweave uninstall`` calls (the DaemonSet, its pods, Nodes, inventories);
    hooks, not release objects, so the defaults still render the kustomize base."""
    docs = render_chart(hooks=True)
    hooks = [d for d in docs if is_hook(d)]
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in hooks} == {"pre-delete"}
    job = _one(hooks, "Job", "gpuweave-uninstall")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    parsed = build_parser().parse_args(container["args"])
    assert parsed.command == "uninstall" and parsed.in_cluster and parsed.daemonset == "gpuweave-node-agent"
    assert (
        parsed.timeout + 60 == job["spec"]["activeDeadlineSeconds"] <= 300
    )  # under helm's default --timeout
    assert pod["serviceAccountName"] == _one(hooks, "ServiceAccount")["metadata"]["name"]
    role = {
        (r["apiGroups"][0], res): set(r["verbs"])
        for r in _one(hooks, "Role")["rules"]
        for res in r["resources"]
    }
    assert role == {("apps", "daemonsets"): {"get", "update"}, ("", "pods"): {"list"}}
    cluster = _one(hooks, "ClusterRole", "gpuweave-uninstall")["rules"]
    granted = {(r["apiGroups"][0], res): set(r["verbs"]) for r in cluster for res in r["resources"]}
    assert granted[("gpuweave.io", "gpunodeinventories")] == {"list", "delete"}
    assert {"list", "patch"} <= granted[("", "nodes")] and "patch" in granted[("", "nodes/status")]
    assert not any(is_hook(d) for d in render_chart())
    assert not [d for d in render_chart(sets=["uninstall.cleanupNodes=false"], hooks=True) if is_hook(d)]


def test_helm_lifecycle_renders_its_rbac_deployment_and_capacity_config(tmp_path: Path) -> None:
    """lifecycle.enabled adds manifests/lifecycle/ (RBAC as it is, the Deployment with the values'
    flags); lifecycle.capacity becomes a CapacityConfig the controller loads, in the release
    namespace; flags parse with gpuweave's own parser."""
    from gpuweave.lifecycle.capacity_config import load_capacity_config  # noqa: PLC0415

    base = _by_key(render_chart())
    plain = _by_key(render_chart(sets=["lifecycle.enabled=true"]))
    lifecycle = REPO / "manifests" / "lifecycle"
    files = [*_kustomize_file(lifecycle / "rbac.yaml"), *_kustomize_file(lifecycle / "deployment.yaml")]
    assert {key: plain[key] for key in set(plain) - set(base)} == _by_key(files)
    pools = [{"nodePool": "gpu-shares", "instanceType": "p5.48xlarge", "offers": "fractional"}]
    values = {"lifecycle": {"enabled": True, "capacity": {"maxNodes": 3, "pools": pools}}}
    rendered = _by_key(render_chart(values, work=tmp_path))
    assert all(rendered[key] == base[key] for key in base)
    added = {key: rendered[key] for key in set(rendered) - set(base)}
    rbac = _by_key(_kustomize_file(REPO / "manifests" / "lifecycle" / "rbac.yaml"))
    assert {key: added[key] for key in rbac} == rbac
    deployment = _one(list(added.values()), "Deployment", "gpuweave-lifecycle")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuweave-lifecycle"
    args = build_parser().parse_args(pod["containers"][0]["args"])
    assert (args.in_cluster, args.no_replacement, args.disruption_cap) == (True, False, 0.1)
    assert str(args.capacity_config) == "/etc/gpuweave-lifecycle/capacity-config.yaml"
    config_map = _one(list(added.values()), "ConfigMap", "gpuweave-lifecycle-capacity")
    path = tmp_path / "capacity-config.yaml"
    path.write_text(config_map["data"]["capacity-config.yaml"])
    config = load_capacity_config(path)
    assert (config.namespace, config.max_nodes, list(config.pools)) == (NAMESPACE, 3, ["gpu-shares"])
    with pytest.raises(RenderError):
        render_chart({"lifecycle": {"capacity": {"pools": [{**pools[0], "offers": "half"}]}}}, work=tmp_path)
    with pytest.raises(RenderError):
        render_chart(sets=["lifecycle.enabled=true", "lifecycle.replacement.enabled=false"])
