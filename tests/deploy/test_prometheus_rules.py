"""deploy/prometheus: the rules pass promtool, say what the brief and the fixtures say."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import rulefiles, tools

FIXTURES = tools.REPO / "tests" / "fixtures" / "alertmanager-0.25"

# alert -> (severity, for) as the seed's rules (shared/reference/nvidia.md) and the brief say
EXPECTED_GPU_RULES = {
    "GPUTemperatureHigh": ("warning", "5m"),
    "GPUTemperatureCritical": ("critical", "2m"),
    "GPUThermalPowerCap": ("warning", "1m"),  # the field guide's thermal script
    "GPUECCUncorrectableError": ("critical", None),
    "GPUECCCorrectableRateHigh": ("warning", "10m"),
    "GPUUtilizationLow": ("warning", "30m"),
    "GPUMemoryUsageHigh": ("warning", "5m"),
    "GPUPowerDrawHigh": ("warning", "10m"),
    "GPUXidError79": ("critical", None),
    "GPUXidErrorECC": ("critical", None),
    # the Xid catalogue: one rule per resolution class, the code in the `xid` label
    "GPUXidApplication": ("warning", None),
    "GPUXidMemory": ("warning", None),
    "GPUXidHang": ("critical", None),
    "GPUXidNVLink": ("critical", None),
    "GPUXidRecoveryAction": ("critical", None),
    "GPUXidBurst": ("warning", None),  # a second code within 10m
    "GPURowRemapPending": ("warning", "5m"),  # H100/H200 row remapping: needs a GPU reset
    "GPURowRemapFailure": ("critical", None),  # no spare row left: replace the GPU
}
EXPECTED_SELF_RULES = {
    "RemediatorBreakerOpen",
    "RemediatorRunsFailing",
    "RemediatorApprovalsWaitingTooLong",
    "RemediatorIntakeRejecting",
    "RemediatorDown",
    "RemediatorEngineStalled",
}
# The captured fixtures came from a harness whose GPUUtilizationLow had severity "info" and no
# pod condition; the shipped rule follows the seed's runbook (warning, only GPUs a pod holds).
FIXTURE_DIFFERENCES: dict[str, dict[str, str]] = {"GPUUtilizationLow": {"severity": "warning"}}
AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|topk|bottomk|group|by|without)\s*\(")


def firing_fixture_alerts() -> dict[str, list[dict[str, Any]]]:
    """Firing alerts of every captured firing delivery, by fixture file name."""
    cases = {}
    for path in sorted(FIXTURES.glob("*-firing-*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        alerts = [a for a in body["alerts"] if a["status"] == "firing"]
        cases[path.stem] = alerts
    return cases


def test_rule_files_pass_promtool_check() -> None:
    out = tools.run("promtool", ["check", "rules", *rulefiles.RULE_FILES])
    assert "18 rules found" in out
    assert "6 rules found" in out


@pytest.mark.parametrize("name", ["gpu-alerts.test.yaml", "remediator-alerts.test.yaml"])
def test_promtool_unit_tests_pass(name: str) -> None:
    out = tools.run("promtool", ["test", "rules", rulefiles.PROMETHEUS_DIR / name])
    assert "SUCCESS" in out


@pytest.mark.parametrize("path", rulefiles.RULE_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_see_every_alert_fire(path: Path) -> None:
    suite = yaml.safe_load(path.with_suffix(".test.yaml").read_text(encoding="utf-8"))
    fired = {
        case["alertname"]
        for test in suite["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == set(rulefiles.alert_rules(rulefiles.load_groups(path)))


def test_gpu_rules_are_the_seed_rules_plus_xid_with_their_severity_and_hold_time() -> None:
    rules = rulefiles.alert_rules(rulefiles.load_groups(rulefiles.GPU_RULES))
    found = {name: (r["labels"]["severity"], r.get("for")) for name, r in rules.items()}
    assert found == EXPECTED_GPU_RULES


def test_every_alert_name_the_fixtures_carry_has_a_rule() -> None:
    names = {
        a["labels"]["alertname"] for alerts in firing_fixture_alerts().values() for a in alerts
    }
    assert names == {
        "GPUTemperatureHigh",
        "GPUTemperatureCritical",
        "GPUECCUncorrectableError",
        "GPUUtilizationLow",
        "GPUXidError79",
    }
    assert names <= set(rulefiles.alert_rules(rulefiles.load_groups(rulefiles.GPU_RULES)))


def test_self_alerts_are_the_expected_ones_and_never_look_like_gpu_alerts() -> None:
    rules = rulefiles.alert_rules(rulefiles.load_groups(rulefiles.SELF_RULES))
    assert set(rules) == EXPECTED_SELF_RULES
    for rule in rules.values():
        assert rule["labels"]["component"] == "remediator"
        assert not rule["alert"].startswith("GPU"), "GPU.* alerts are routed to remediator"


@pytest.mark.parametrize("path", rulefiles.RULE_FILES, ids=lambda p: p.name)
def test_every_rule_has_severity_summary_and_description(path: Path) -> None:
    for rule in rulefiles.alert_rules(rulefiles.load_groups(path)).values():
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert set(rule["annotations"]) == {"summary", "description"}


def test_gpu_rules_keep_every_exporter_label_and_always_set_node() -> None:
    for name, rule in rulefiles.alert_rules(rulefiles.load_groups(rulefiles.GPU_RULES)).items():
        assert not AGGREGATION.search(rule["expr"]), f"{name} aggregates labels away"
        assert "Hostname" in rule["labels"]["node"], f"{name}: node must fall back to Hostname"


@pytest.mark.parametrize("path", rulefiles.RULE_FILES, ids=lambda p: p.name)
def test_comment_header_describes_the_rules_below_it(path: Path) -> None:
    rules = rulefiles.alert_rules(rulefiles.load_groups(path))
    header = rulefiles.load_header(path)
    described = {e["alert"]: (e["severity"], e["for"]) for e in header}
    assert described == {n: (r["labels"]["severity"], r.get("for")) for n, r in rules.items()}
    assert all(e["condition"] and e["remediation"] for e in header)


def test_rule_expressions_are_the_ones_behind_the_captured_fixtures() -> None:
    rules = rulefiles.alert_rules(rulefiles.load_groups(rulefiles.GPU_RULES))
    for alerts in firing_fixture_alerts().values():
        for alert in alerts:
            name = alert["labels"]["alertname"]
            query = urllib.parse.urlparse(alert["generatorURL"]).query
            expr = urllib.parse.parse_qs(query)["g0.expr"][0]
            if name == "GPUUtilizationLow":  # ours adds the "a pod holds the GPU" condition
                assert expr in rules[name]["expr"].replace('{exported_pod!=""}', "")
            elif name in ("GPUTemperatureHigh", "GPUTemperatureCritical"):  # + recovery
                assert rules[name]["expr"].startswith(f"{expr} or (")
            else:
                assert rules[name]["expr"] == expr


def _fixture_test_case(name: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    values = {
        "GPUTemperatureHigh": ("DCGM_FI_DEV_GPU_TEMP", r"\((\d+)°C\)"),
        "GPUTemperatureCritical": ("DCGM_FI_DEV_GPU_TEMP", r"\((\d+)°C\)"),
        "GPUECCUncorrectableError": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", r"reports (\d+) volatile"),
        "GPUUtilizationLow": ("DCGM_FI_DEV_GPU_UTIL", r"\(current (\d+)%\)"),
        "GPUXidError79": ("DCGM_FI_DEV_XID_ERRORS", r"Xid (79)"),
    }
    series, expected = [], []
    alertname = alerts[0]["labels"]["alertname"]
    for alert in alerts:
        metric, pattern = values[alertname]
        text = alert["annotations"]["summary"] + alert["annotations"]["description"]
        value = re.search(pattern, text)
        assert value, f"{name}: cannot read the value from {text!r}"
        labels = {k: v for k, v in alert["labels"].items() if k not in {"alertname", "cluster"}}
        inputs = {k: v for k, v in labels.items() if k != "severity"}
        matchers = ", ".join(f'{k}="{v}"' for k, v in sorted(inputs.items()))
        series.append({"series": f"{metric}{{{matchers}}}", "values": f"{value.group(1)}x30"})
        expected.append(
            {
                "exp_labels": labels | FIXTURE_DIFFERENCES.get(alertname, {}),
                "exp_annotations": alert["annotations"],
            }
        )
    return {
        "name": name,
        "interval": "1s",
        "input_series": series,
        "alert_rule_test": [{"eval_time": "20s", "alertname": alertname, "exp_alerts": expected}],
    }


def test_shortened_rules_reproduce_the_captured_alertmanager_fixtures(tmp_path: Path) -> None:
    """The fixtures were produced with `for:` of a few seconds; so is this run."""
    cases = firing_fixture_alerts()
    holds = {}
    for alerts in cases.values():
        for alert in alerts:
            held = re.search(r"for more than (\w+)", alert["annotations"]["description"])
            holds[alert["labels"]["alertname"]] = held.group(1) if held else "2s"
    groups = rulefiles.shorten_for(rulefiles.load_groups(rulefiles.GPU_RULES), holds)
    (tmp_path / "rules.yaml").write_text(rulefiles.dump({"groups": groups}), encoding="utf-8")
    tests = [_fixture_test_case(name, alerts) for name, alerts in cases.items()]
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1s", "tests": tests}
    (tmp_path / "fixtures.test.yaml").write_text(rulefiles.dump(suite), encoding="utf-8")
    out = tools.run("promtool", ["test", "rules", tmp_path / "fixtures.test.yaml"])
    assert "SUCCESS" in out


def test_shorten_for_rewrites_hold_times_and_their_wording_only() -> None:
    groups = rulefiles.load_groups(rulefiles.GPU_RULES)
    short = rulefiles.alert_rules(rulefiles.shorten_for(groups, "3s"))
    original = rulefiles.alert_rules(groups)
    for name, rule in short.items():
        assert rule.get("for") == ("3s" if "for" in original[name] else None)
        assert rule["expr"] == original[name]["expr"]
    assert "for more than 3s" in short["GPUTemperatureHigh"]["annotations"]["description"]
    assert "for more than 5m" in original["GPUTemperatureHigh"]["annotations"]["description"]


def test_prometheus_rule_manifest_embeds_exactly_the_rule_files() -> None:
    committed = yaml.safe_load(rulefiles.PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert committed == rulefiles.build_prometheus_rule(), (
        "deploy/kustomize/base/prometheusrule.yaml is stale: run "
        "`python tests/deploy/rulefiles.py prometheusrule > "
        "deploy/kustomize/base/prometheusrule.yaml`"
    )
    gpu = rulefiles.load_groups(rulefiles.GPU_RULES)
    assert committed["spec"]["groups"][: len(gpu)] == gpu


def test_shorten_command_prints_a_rule_file_promtool_accepts(tmp_path: Path) -> None:
    out = tmp_path / "short.yaml"
    with out.open("w", encoding="utf-8") as handle, contextlib.redirect_stdout(handle):
        rulefiles.main(["shorten", str(rulefiles.GPU_RULES), "--for", "2s"])
    assert "for: 2s" in out.read_text(encoding="utf-8")
    tools.run("promtool", ["check", "rules", out])
