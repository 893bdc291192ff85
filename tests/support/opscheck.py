"""The operator-file checker (tests/e2e/opscheck): Helm's engine and Prometheus' PromQL parser.

``render_chart`` renders manifests/helm/gpuweave as ``helm template --include-crds`` does;
``parse_promql`` parses expressions and returns the vector selectors the parser found;
``load_rules`` loads a rule file as Prometheus does (``promtool check rules``). The binary
is built by tests/e2e/opscheck/build.sh, which tests/e2e/harness/build.sh runs; a missing binary
fails the test with that instruction and is never a skip.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.control_plane import built_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "helm" / "gpuweave"
OPSCHECK_DIR = REPO / "tests" / "e2e" / "opscheck"


def opscheck_binary() -> Path:
    return built_binary(
        OPSCHECK_DIR / "bin" / "opscheck",
        env="GPUWEAVE_OPSCHECK",
        what="opscheck binary",
        build="tests/e2e/opscheck/build.sh "
        "(tests/e2e/harness/build.sh runs it; Go >= 1.26.7, a few minutes cold)",
    )


class RenderError(Exception):
    """Helm refused to render: the message is Helm's (schema violation, template ``fail``)."""


def render_chart(
    values: Mapping[str, Any] | None = None,
    *,
    sets: Sequence[str] = (),
    namespace: str = "gpuweave-system",
    work: Path | None = None,
) -> list[dict[str, Any]]:
    """The chart's objects for ``values`` (a values file's content) and ``--set`` strings."""
    argv = [str(opscheck_binary()), "render", str(CHART), "--namespace", namespace]
    if values is not None:
        if work is None:
            raise ValueError("render_chart: values need a work directory for the values file")
        path = work / "values.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        argv += ["--values", str(path)]
    for item in sets:
        argv += ["--set", item]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderError(
            done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@dataclass(frozen=True)
class Selector:
    metric: str  # "" when the selector names no metric by equality
    labels: frozenset[str]  # the label names its matchers use
    matchers: tuple[tuple[str, str, str], ...] = ()  # (label, op, value) as the parser reads them

    def equal(self, label: str) -> str | None:
        """The value an ``=`` matcher gives ``label``, None when there is none."""
        return next((v for name, op, v in self.matchers if name == label and op == "="), None)


@dataclass(frozen=True)
class Parsed:
    name: str
    error: str
    selectors: tuple[Selector, ...]


def parse_promql(expressions: Mapping[str, str]) -> dict[str, Parsed]:
    """Each expression parsed by Prometheus' parser, by the name given to it."""
    request = {"expressions": [{"name": name, "expr": expr} for name, expr in expressions.items()]}
    done = subprocess.run(
        [str(opscheck_binary()), "promql"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        pytest.fail(f"opscheck promql failed: {done.stderr.strip()}", pytrace=False)
    results: dict[str, Parsed] = {}
    for item in json.loads(done.stdout)["results"]:
        selectors = tuple(
            Selector(
                s["metric"],
                frozenset(m["label"] for m in s["matchers"]),
                tuple((m["label"], m["op"], m["value"]) for m in s["matchers"]),
            )
            for s in item["selectors"]
        )
        results[item["name"]] = Parsed(item["name"], item.get("error", ""), selectors)
    return results


@dataclass(frozen=True)
class LoadedRules:
    groups: int
    rules: int
    errors: tuple[str, ...]


def load_rules(spec: Mapping[str, Any]) -> LoadedRules:
    """A rule file's content (``groups:``; a PrometheusRule's ``spec``) loaded by Prometheus' rulefmt."""
    done = subprocess.run(
        [str(opscheck_binary()), "rules"],
        input=yaml.safe_dump(dict(spec)),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        pytest.fail(f"opscheck rules failed: {done.stderr.strip()}", pytrace=False)
    result = json.loads(done.stdout)
    return LoadedRules(result["groups"], result["rules"], tuple(result["errors"]))
