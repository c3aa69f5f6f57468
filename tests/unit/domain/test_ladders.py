"""The escalation ladder's decisions: one rung per episode, idempotent per run, never down."""

from __future__ import annotations

import datetime as dt

from remediator.domain import ladders

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
MONTH = dt.timedelta(days=30)


def test_each_new_episode_takes_the_next_rung_up_to_replace() -> None:
    state: dict[str, object] = {}
    rungs = []
    for run_id in range(1, 5):
        rung, state = ladders.climb(state, run_id=run_id, now=T0, forget_after=MONTH)
        rungs.append(rung)
    assert rungs == ["reset", "reboot", "replace", "replace"]


def test_a_run_asking_again_gets_the_rung_it_already_has() -> None:
    rung, state = ladders.climb({}, run_id=7, now=T0, forget_after=MONTH)
    again, same = ladders.climb(state, run_id=7, now=T0 + dt.timedelta(hours=1), forget_after=MONTH)
    assert (rung, again) == ("reset", "reset")
    assert same == state


def test_a_gpu_quiet_for_longer_than_forget_after_starts_over() -> None:
    _, state = ladders.climb({}, run_id=1, now=T0, forget_after=MONTH)
    _, state = ladders.climb(state, run_id=2, now=T0 + dt.timedelta(days=1), forget_after=MONTH)
    rung, state = ladders.climb(state, run_id=3, now=T0 + dt.timedelta(days=60), forget_after=MONTH)
    assert rung is ladders.Rung.RESET
    assert state["history"][-1]["reason"] == "earlier episodes forgotten"


def test_escalation_raises_this_runs_rung_and_never_lowers_it() -> None:
    _, state = ladders.climb({}, run_id=1, now=T0, forget_after=MONTH)
    rung, state = ladders.escalate(
        state, run_id=1, to=ladders.Rung.REBOOT, now=T0, reason="reset failed"
    )
    assert rung is ladders.Rung.REBOOT
    assert ladders.rung_of_run(state, 1) is ladders.Rung.REBOOT
    lower, unchanged = ladders.escalate(
        state, run_id=1, to=ladders.Rung.RESET, now=T0, reason="pending remap"
    )
    assert lower is ladders.Rung.REBOOT
    assert unchanged == state
    # The next episode goes on from the escalated rung.
    rung, _ = ladders.climb(state, run_id=2, now=T0, forget_after=MONTH)
    assert rung is ladders.Rung.REPLACE


def test_a_playbook_can_start_higher_and_the_history_stays_bounded() -> None:
    rung, state = ladders.climb({}, run_id=1, now=T0, forget_after=MONTH, start=ladders.Rung.REBOOT)
    assert rung is ladders.Rung.REBOOT
    for run_id in range(2, 40):
        _, state = ladders.climb(state, run_id=run_id, now=T0, forget_after=MONTH)
    assert len(state["history"]) == ladders.HISTORY


def test_keys_are_per_gpu_and_case_insensitive() -> None:
    assert ladders.key("gpu-node-03", "GPU-E9515ED6-254D-5ED7-8E04-AEA9CC21A64F") == (
        "ladder:gpu-node-03:gpu-e9515ed6-254d-5ed7-8e04-aea9cc21a64f"
    )
    assert ladders.key("gpu-node-03", None) == "ladder:gpu-node-03:node"


def test_a_declined_run_is_on_no_rung_and_leaves_the_gpus_ladder_as_it_was() -> None:
    _, state = ladders.climb({}, run_id=1, now=T0, forget_after=MONTH)
    rung, after = ladders.decline(state, run_id=2, now=T0, reason="driver recommends None")
    assert rung is None
    assert ladders.rung_of_run(after, 2) is None
    assert ladders.declined(after, 2)["reason"] == "driver recommends None"
    assert (after["rung"], after["at"]) == (state["rung"], state["at"])
    next_rung, _ = ladders.climb(after, run_id=3, now=T0, forget_after=MONTH)
    assert next_rung == "reboot"  # the declined episode did not climb


def test_a_run_with_a_rung_is_never_declined_but_a_declined_run_can_still_escalate() -> None:
    rung, state = ladders.escalate({}, run_id=1, to=ladders.Rung.REBOOT, now=T0, reason="x")
    same, unchanged = ladders.decline(state, run_id=1, now=T0, reason="none")
    assert (rung, same) == ("reboot", "reboot")
    assert unchanged == state
    _, declined = ladders.decline({}, run_id=2, now=T0, reason="none")
    up, escalated = ladders.escalate(declined, run_id=2, to=ladders.Rung.RESET, now=T0, reason="y")
    assert up == "reset"
    assert ladders.declined(escalated, 2) is None
