"""The shipped alert rules, thermal playbook and health sweep hold the field guide's numbers.

The table below is the NVIDIA field guide the seed's rules and scripts come from: its alert
rules (metric, comparison, threshold, hold time, severity), its thermal script (cap at >= 83°C,
restore only below 73°C) and its health check (flags >= 80°C, exits non-zero when anything is
wrong). Each shipped rule's firing condition is parsed from its expression and compared with
the table, so a threshold edited in one place and not the other, or a per-second ``rate`` where
the guide counts per hour, fails here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from remediator.actions import health
from tests.conftest import ROOT
from tests.deploy import rulefiles

# alert: (comparisons of the firing condition, for, severity)
GUIDE_RULES: dict[str, tuple[set[tuple[str, str, Any]], str | None, str]] = {
    "GPUTemperatureHigh": ({("DCGM_FI_DEV_GPU_TEMP", ">", 85)}, "5m", "warning"),
    "GPUTemperatureCritical": ({("DCGM_FI_DEV_GPU_TEMP", ">", 90)}, "2m", "critical"),
    "GPUECCUncorrectableError": ({("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", ">", 0)}, None, "critical"),
    # The guide's table: more than 100 correctable errors per hour (an increase over 1h).
    "GPUECCCorrectableRateHigh": (
        {("increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[1h])", ">", 100)},
        "10m",
        "warning",
    ),
    "GPUUtilizationLow": ({("DCGM_FI_DEV_GPU_UTIL", "<", 30)}, "30m", "warning"),
    "GPUMemoryUsageHigh": (
        {("DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", ">", 0.95)},
        "5m",
        "warning",
    ),
    "GPUPowerDrawHigh": (
        {("DCGM_FI_DEV_POWER_USAGE", ">", "DCGM_FI_DEV_POWER_MGMT_LIMIT * 0.95")},
        "10m",
        "warning",
    ),
    # The guide's thermal script: cap at >= 83°C ...
    "GPUThermalPowerCap": ({("DCGM_FI_DEV_GPU_TEMP", ">=", 83)}, "1m", "warning"),
}
GUIDE_RESTORE_BELOW = 73  # ... restore only below 73°C (threshold - 10)
GUIDE_HEALTH_CHECK = {"temperature_warning": 80, "temperature_critical": 85}

_COMPARISON = re.compile(
    r"(?P<left>increase\([A-Z_]+\[\w+\]\)|[A-Z_]+(?:\{[^}]*\})?"
    r"(?: / \([A-Z_]+ \+ [A-Z_]+\))?)\s*(?P<op>>=|<=|==|>|<)\s*"
    r"(?P<right>[A-Z_]+ \* [0-9.]+|[0-9.]+)"
)


def rules() -> dict[str, dict[str, Any]]:
    return rulefiles.alert_rules(rulefiles.load_groups(rulefiles.GPU_RULES))


def split_hysteresis(expr: str) -> tuple[str, str | None]:
    """``<firing> or (<metric> >= <floor> and on(UUID) ALERTS{...})`` → (firing, hold)."""
    firing, sep, hold = " ".join(expr.split()).partition(" or (")
    if sep and "ALERTS{" in hold:
        return firing, hold
    return " ".join(expr.split()), None


def comparisons(text: str) -> set[tuple[str, str, Any]]:
    found = set()
    for match in _COMPARISON.finditer(text):
        left = re.sub(r"\{[^}]*\}", "", match["left"])
        right = match["right"]
        found.add((left, match["op"], right if "*" in right else float(right)))
    return found


@pytest.mark.parametrize("alert", sorted(GUIDE_RULES))
def test_each_rule_fires_at_the_guide_threshold_with_its_hold_time_and_severity(
    alert: str,
) -> None:
    rule = rules()[alert]
    expected, hold_time, severity = GUIDE_RULES[alert]
    firing, _ = split_hysteresis(rule["expr"])
    assert comparisons(firing) == expected, firing
    assert rule.get("for") == hold_time
    assert rule["labels"]["severity"] == severity


def test_no_rule_compares_a_per_second_rate_with_a_per_hour_threshold() -> None:
    for name, rule in rules().items():
        assert "rate(" not in rule["expr"].replace("increase(", ""), name
    description = rules()["GPUECCCorrectableRateHigh"]["annotations"]["description"]
    assert "per hour" in description
    assert "per second" not in description
    assert "/s" not in description


@pytest.mark.parametrize(
    "alert", ["GPUThermalPowerCap", "GPUTemperatureHigh", "GPUTemperatureCritical"]
)
def test_alerts_whose_resolution_restores_the_power_limit_hold_until_below_73(alert: str) -> None:
    """The thermal playbooks undo their caps when these resolve: they must resolve only below
    the guide's restore threshold, never at the firing threshold (no flapping), and never
    while another of them still holds the same GPU's cap."""
    _, hold = split_hysteresis(rules()[alert]["expr"])
    assert hold is not None, f"{alert} has no recovery condition"
    assert comparisons(hold) == {("DCGM_FI_DEV_GPU_TEMP", ">=", GUIDE_RESTORE_BELOW)}
    assert f'ALERTS{{alertname="{alert}", alertstate="firing"}}' in hold
    assert "on(UUID)" in hold  # per GPU, never another GPU's alert


def test_the_thermal_playbook_answers_the_capping_alerts_and_undoes_on_resolve() -> None:
    playbook = yaml.safe_load((ROOT / "rules" / "gpu-temperature-high.yaml").read_text())
    assert set(playbook["match"]["alertname"]) == {"GPUThermalPowerCap", "GPUTemperatureHigh"}
    assert playbook["on_resolve"] == "undo"


def test_the_health_sweep_defaults_to_the_guide_and_fails_on_critical_findings() -> None:
    defaults = health.Thresholds()
    assert defaults.temperature_warning == GUIDE_HEALTH_CHECK["temperature_warning"]
    assert defaults.temperature_critical == GUIDE_HEALTH_CHECK["temperature_critical"]
    hot = health.GpuHealth(**{**_gpu(), "temperature": 80.0})
    assert health.gpu_flags(hot, defaults, held=False) == [("warning", "temperature 80C >= 80C")]
    sweep = yaml.safe_load((ROOT / "rules" / "fleet-health-sweep.yaml").read_text())
    parameters = sweep["parameters"]
    for name, value in GUIDE_HEALTH_CHECK.items():
        assert parameters[name]["default"] == value
        assert f'params.{name} or "{value}"' in sweep["steps"][0]["params"]["thresholds"][name]
    assert parameters["fail_on"]["default"] == "critical"
    assert 'params.fail_on or "critical"' in sweep["steps"][0]["params"]["fail_on"]


def _gpu() -> dict[str, Any]:
    return {
        "index": 0,
        "uuid": "GPU-0",
        "pci_bus_id": "00000000:18:00.0",
        "name": "NVIDIA H200",
        "temperature": 40.0,
        "utilization": 90.0,
        "memory_used": 100.0,
        "memory_total": 143771.0,
        "ecc_uncorrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "ecc_corrected_volatile": 0,
        "power_draw": 300.0,
        "power_limit": 700.0,
        "power_default_limit": 700.0,
    }
