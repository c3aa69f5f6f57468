"""deploy/grafana/remediator-dashboard.json queries only remediator's fixed self-metrics."""

from __future__ import annotations

import json
import re
from typing import Any

from . import tools

DASHBOARD = tools.DEPLOY / "grafana" / "remediator-dashboard.json"
COUNTERS_AND_GAUGES = {
    "remediator_alerts_received_total",
    "remediator_alerts_deduplicated_total",
    "remediator_deliveries_total",
    "remediator_deliveries_rejected_total",
    "remediator_runs_total",
    "remediator_approvals_pending",
    "remediator_approval_oldest_age_seconds",
    "remediator_breaker_open",
    "remediator_budget_nodes_in_use",
    "remediator_claim_loop_lag_seconds",
}
HISTOGRAMS = {"remediator_step_duration_seconds", "remediator_db_latency_seconds"}
ALLOWED = COUNTERS_AND_GAUGES | {
    h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
KEYWORDS |= {"unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (strings, matchers, ranges, functions removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"[A-Za-z_][A-Za-z0-9_]*\s*\(", "(", text)
    names = set(re.findall(r"(?<![$\w.])[A-Za-z_:][A-Za-z0-9_:]*", text))
    return names - KEYWORDS


def base_name(metric: str) -> str:
    """The histogram a _bucket/_sum/_count series belongs to, else the name itself."""
    stem = re.sub(r"_(bucket|sum|count)$", "", metric)
    return stem if stem in HISTOGRAMS else metric


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(re.sub(r"label_values\((\w+),.*\)", r"\1", variable["definition"]))
    return found


def test_dashboard_is_valid_json_with_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


def test_metric_name_extraction_sees_through_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, action) (rate(a_bucket{x=~"$y"}[5m]))) '
        "/ on (action) group_left b_total"
    )
    assert metric_names(expr) == {"a_bucket", "b_total"}


def test_every_queried_metric_is_a_fixed_self_metric_and_all_are_shown() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    used: set[str] = set()
    for expr in queries(dashboard):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= ALLOWED, f"unknown metric(s) {names - ALLOWED} in {expr!r}"
        used |= names
    shown = {base_name(n) for n in used}
    assert shown >= COUNTERS_AND_GAUGES | HISTOGRAMS
