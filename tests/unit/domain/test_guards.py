from __future__ import annotations

import datetime as dt

import pydantic
import pytest

from remediator.domain import guards

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)  # a Monday


def snap(**changes):
    base = {
        "disrupted_nodes": frozenset(),
        "gpu_nodes": None,
        "recent_runs": 0,
        "breaker_open": False,
        "node_last_disrupted": None,
    }
    return guards.Snapshot(**(base | changes))


def test_a_node_within_budget_may_be_disrupted():
    verdict = guards.decide(guards.GuardConfig(max_nodes=2), snap(), node="n1", now=NOW)
    assert verdict.go


def test_a_full_budget_holds_the_step_visibly():
    config = guards.GuardConfig(max_nodes=2)
    verdict = guards.decide(config, snap(disrupted_nodes=frozenset({"a", "b"})), node="c", now=NOW)
    assert not verdict.go
    assert verdict.reason == "disruption budget in use: 2 of 2 nodes"
    assert verdict.until == NOW + config.budget_recheck  # or sooner, when woken
    assert guards.wait_key(verdict.kind, None) == "budget:"


def test_what_a_held_step_waits_for_is_said_in_words():
    assert guards.waited_for(guards.wait_key("budget", None)) == "the disruption budget"
    assert guards.waited_for(guards.wait_key("budget", "h100")) == (
        "the disruption budget of pool h100"
    )
    assert guards.waited_for(guards.wait_key("breaker", "h100")) == "the circuit breaker's reset"


def test_a_node_already_disrupted_costs_no_more_budget():
    config = guards.GuardConfig(max_nodes=1)
    verdict = guards.decide(config, snap(disrupted_nodes=frozenset({"a"})), node="a", now=NOW)
    assert verdict.go


def test_the_percentage_cap_uses_the_gpu_node_count():
    config = guards.GuardConfig(max_nodes=10, max_percent=10)
    assert guards.budget_limit(config, 25) == 3
    assert guards.budget_limit(config, 4) == 1
    assert guards.budget_limit(config, 200) == 10
    assert guards.budget_limit(config, None) == 10
    assert guards.budget_limit(config.model_copy(update={"max_percent": 0}), 50) == 0
    full = snap(gpu_nodes=4, disrupted_nodes=frozenset({"b"}))
    verdict = guards.decide(config, full, node="a", now=NOW)
    assert not verdict.go
    assert verdict.reason == "disruption budget in use: 1 of 1 nodes"


def test_too_many_disruptive_runs_trip_the_breaker():
    config = guards.GuardConfig(max_disruptive_runs=5)
    assert guards.decide(config, snap(recent_runs=5), node="a", now=NOW).go
    verdict = guards.decide(config, snap(recent_runs=6), node="a", now=NOW)
    assert not verdict.go
    assert verdict.trips_breaker


def test_an_open_breaker_holds_every_disruptive_step():
    verdict = guards.decide(guards.GuardConfig(), snap(breaker_open=True), node="a", now=NOW)
    assert not verdict.go
    assert not verdict.trips_breaker
    assert "reset" in verdict.reason


def test_a_recently_disrupted_node_cools_down():
    config = guards.GuardConfig(node_cooldown=dt.timedelta(minutes=30))
    last = NOW - dt.timedelta(minutes=10)
    verdict = guards.decide(config, snap(node_last_disrupted=last), node="a", now=NOW)
    assert not verdict.go
    assert verdict.until == last + dt.timedelta(minutes=30)


def test_change_windows_hold_until_the_next_opening():
    window = guards.ChangeWindow(days=["tue"], start="02:00", end="04:00", timezone="Europe/Berlin")
    config = guards.GuardConfig(change_windows=[window])
    verdict = guards.decide(config, snap(), node="a", now=NOW)
    assert not verdict.go
    assert verdict.until == dt.datetime(2026, 12, 1, 1, 0, tzinfo=dt.UTC)
    inside = dt.datetime(2026, 12, 1, 2, 30, tzinfo=dt.UTC)  # 03:30 in Berlin
    assert guards.decide(config, snap(), node="a", now=inside).go


def test_a_window_may_span_midnight():
    window = guards.ChangeWindow(start="22:00", end="06:00")
    assert window.contains(dt.datetime(2026, 11, 30, 23, 0, tzinfo=dt.UTC))
    assert window.contains(dt.datetime(2026, 11, 30, 5, 0, tzinfo=dt.UTC))
    assert not window.contains(NOW)


def test_unknown_timezones_are_refused():
    with pytest.raises(pydantic.ValidationError):
        guards.ChangeWindow(timezone="Mars/Olympus")


def test_a_playbook_override_changes_only_what_it_sets():
    base = guards.GuardConfig(max_nodes=3, max_percent=20)
    merged = guards.GuardOverride(max_nodes=1).apply(base)
    assert (merged.max_nodes, merged.max_percent) == (1, 20)


@pytest.mark.parametrize(
    ("labels", "holder"),
    [
        ({guards.DRIVER_UPGRADE_STATE: "drain-required"}, "the GPU Operator"),
        ({guards.DRIVER_UPGRADE_STATE: "pod-restart-required"}, "the GPU Operator"),
        ({guards.UPGRADE_MARK: "in-progress"}, "remediator's driver rollout"),
    ],
)
def test_a_node_whose_driver_is_being_upgraded_holds_disruptive_steps(labels, holder):
    verdict = guards.decide(guards.GuardConfig(), snap(node_labels=labels), node="n1", now=NOW)
    assert not verdict.go
    assert verdict.kind == "driver_upgrade"
    assert verdict.reason.startswith(f"node n1: {holder} is upgrading")
    assert verdict.until == NOW + guards.GuardConfig().recheck


@pytest.mark.parametrize(
    "labels",
    [
        {},
        {guards.DRIVER_UPGRADE_STATE: "upgrade-done"},
        {guards.DRIVER_UPGRADE_STATE: ""},
        {guards.DRIVER_UPGRADE_STATE: "upgrade-failed"},
        {guards.UPGRADE_MARK: "failed"},
    ],
)
def test_a_node_not_being_upgraded_is_not_held_for_it(labels):
    verdict = guards.decide(guards.GuardConfig(), snap(node_labels=labels), node="n1", now=NOW)
    assert verdict.go


def test_a_playbook_s_change_windows_hold_its_disruptive_steps_outside_them():
    override = guards.GuardOverride.model_validate(
        {"change_windows": [{"days": ["tue"], "start": "02:00", "end": "04:00"}]}
    )
    config = override.apply(guards.GuardConfig())
    verdict = guards.decide(config, snap(), node="a", now=NOW)
    assert (verdict.go, verdict.kind) == (False, "change_window")
    tuesday = dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.UTC)
    assert guards.decide(config, snap(), node="a", now=tuesday).go
