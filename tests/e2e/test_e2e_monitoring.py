"""The Grafana dashboard and the alerting rules: every PromQL expression parses with Prometheus' own
parser (tests/e2e/opscheck) and reads only series gpuweave exports, with labels those series have;
the rule file loads as Prometheus loads it (durations, templates)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.exported_metrics import readable_series
from tests.support.opscheck import Parsed, load_rules, parse_promql, render_chart

pytestmark = pytest.mark.e2e

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
DASHBOARD = MONITORING / "gpuweave-dashboard.json"
ALERTS = MONITORING / "gpuweave-alerts.yaml"

# Grafana replaces its interval macros before the query reaches Prometheus; the values are typical.
GRAFANA_MACROS = {"$__rate_interval": "2m", "$__interval": "30s", "$__range": "6h"}
LABEL_VALUES = re.compile(
    r"^label_values\((?P<metric>[a-zA-Z_:][a-zA-Z0-9_:]*),\s*(?P<label>[a-zA-Z_]\w*)\)$"
)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_expressions(dashboard: Mapping[str, Any]) -> dict[str, str]:
    expressions: dict[str, str] = {}
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for macro, value in GRAFANA_MACROS.items():
                expr = expr.replace(macro, value)
            expressions[f"panel {panel['title']!r} {target['refId']}"] = expr
    return expressions


def rule_expressions(spec: Mapping[str, Any]) -> dict[str, str]:
    return {
        f"{group['name']}/{rule.get('alert') or rule['record']}": rule["expr"]
        for group in spec["groups"]
        for rule in group["rules"]
    }


def _unknown_reads(parsed: Mapping[str, Parsed], series: Mapping[str, frozenset[str]]) -> list[str]:
    problems = []
    for name, result in parsed.items():
        if result.error:
            problems.append(f"{name}: {result.error}")
            continue
        if not result.selectors:
            problems.append(f"{name}: reads no series")
        for selector in result.selectors:
            if selector.metric not in series:
                problems.append(
                    f"{name}: {selector.metric or '(no metric name)'} is not a series gpuweave exports"
                )
            elif unknown := selector.labels - series[selector.metric]:
                problems.append(f"{name}: {selector.metric} has no label {sorted(unknown)}")
    return problems


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> dict[str, frozenset[str]]:
    return readable_series(tmp_path_factory.mktemp("metrics"))


def test_dashboard_queries_parse_and_read_exported_series(series: dict[str, frozenset[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = dashboard_expressions(dashboard)
    assert len(expressions) >= 15
    assert _unknown_reads(parse_promql(expressions), series) == []


def test_dashboard_variables_read_exported_series(series: dict[str, frozenset[str]]) -> None:
    variables = [v for v in json.loads(DASHBOARD.read_text())["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"node", "product"}
    for variable in variables:
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match, variable["query"]
        assert match["label"] in series[match["metric"]], variable["name"]


def test_dashboard_covers_the_operator_questions() -> None:
    """Allocation per node kind, withheld and retired devices, MIG reshapes, extender latency per
    verb, handoff mismatches, per-pod GPU use and the share's memory limit."""
    text = " ".join(dashboard_expressions(json.loads(DASHBOARD.read_text())).values())
    for needle in [
        "gpuweave_extender_free_gpus",
        'state!="Healthy"',
        'state="Retired"',
        "gpuweave_mig_reshapes_total",
        "sum by (verb, le) (rate(gpuweave_extender_request_seconds_bucket",
        'outcome=~"mismatch|admitted_mismatch"',
        "gpuweave_pod_gpu_utilization_ratio",
        "gpuweave_pod_gpu_memory_limit_bytes",
    ]:
        assert needle in text


def test_alert_rules_parse_and_read_exported_series(series: dict[str, frozenset[str]]) -> None:
    spec = yaml.safe_load(ALERTS.read_text())["spec"]
    expressions = rule_expressions(spec)
    assert set(expressions) == {
        "gpuweave-devices/GpuweaveDeviceWithheld",
        "gpuweave-devices/GpuweaveBadHardwareListGrew",
        "gpuweave-scheduling/GpuweaveExtenderSlow",
        "gpuweave-scheduling/GpuweaveExtenderBindSlow",
        "gpuweave-scheduling/GpuweaveAssignmentMismatch",
        "gpuweave-shares/GpuweaveShareOverMemoryLimit",
        "gpuweave-components/GpuweaveNodeAgentDown",
        "gpuweave-components/GpuweaveExtenderDown",
        "gpuweave-components/GpuweaveNoHealthyExtender",
    }
    assert _unknown_reads(parse_promql(expressions), series) == []


def test_component_alerts_select_the_jobs_the_charts_service_monitors_scrape() -> None:
    """The Prometheus Operator names a ServiceMonitor's job after the Service it selects: every
    `job` a rule names is one of the metrics Services the chart renders with monitoring on, and
    the agent and the extender each have a down alert and the extender a none-ready one."""
    docs = render_chart(sets=["monitoring.enabled=true"])
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    services = {name for name in names if name.endswith("-metrics")}
    assert services == {"gpuweave-scheduler-metrics", "gpuweave-node-agent-metrics"}
    spec = yaml.safe_load(ALERTS.read_text())["spec"]
    parsed = parse_promql(rule_expressions(spec))
    jobs = {
        name.partition("/")[2]: {s.equal("job") for s in result.selectors} - {None}
        for name, result in parsed.items()
        if any(s.equal("job") for s in result.selectors)
    }
    assert jobs == {
        "GpuweaveNodeAgentDown": {"gpuweave-node-agent-metrics"},
        "GpuweaveExtenderDown": {"gpuweave-scheduler-metrics"},
        "GpuweaveNoHealthyExtender": {"gpuweave-scheduler-metrics"},
    }


def test_alert_rules_load_as_prometheus_loads_them() -> None:
    loaded = load_rules(yaml.safe_load(ALERTS.read_text())["spec"])
    assert (loaded.groups, loaded.rules, loaded.errors) == (4, 9, ())
    broken = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "A",
                        "expr": "up == 0",
                        "for": "5m",
                        "annotations": {"summary": "{{ $value | nosuch }}"},
                    }
                ],
            }
        ]
    }
    assert 'function "nosuch" not defined' in " ".join(load_rules(broken).errors)


def test_checker_reports_a_broken_expression_and_an_unknown_metric(series: dict[str, frozenset[str]]) -> None:
    """The check itself fails where it should: a parse error, a renamed metric, a wrong label."""
    parsed = parse_promql(
        {
            "broken": "sum(rate(gpuweave_extender_binds_total[5m])",
            "renamed": "rate(gpuweave_extender_bind_total[5m])",
            "label": 'gpuweave_health_device_state{status="Retired"}',
        }
    )
    problems = _unknown_reads(parsed, series)
    assert len(problems) == 3
    assert "parse error" in problems[0]
    assert "gpuweave_extender_bind_total is not a series" in problems[1]
    assert "has no label ['status']" in problems[2]
