from __future__ import annotations

import datetime as dt

from remediator.domain import retry, runs


def test_terminal_statuses_have_no_way_out_except_undone():
    for status in runs.RUN_TERMINAL:
        assert runs.RUN_TRANSITIONS[status] == frozenset()
    for status in runs.STEP_TERMINAL - {runs.StepStatus.SUCCEEDED}:
        assert runs.STEP_TRANSITIONS[status] == frozenset()
    assert runs.STEP_TRANSITIONS[runs.StepStatus.SUCCEEDED] == {runs.StepStatus.UNDONE}


def test_every_status_is_in_the_transition_tables():
    assert set(runs.RUN_TRANSITIONS) == set(runs.RunStatus)
    assert set(runs.STEP_TRANSITIONS) == set(runs.StepStatus)


def test_sources_invert_the_table():
    assert runs.run_sources(runs.RunStatus.REJECTED) == {runs.RunStatus.WAITING_APPROVAL}
    assert runs.step_sources(runs.StepStatus.RUNNING) == {runs.StepStatus.PENDING}


def test_final_status_waits_for_active_steps():
    S = runs.StepStatus
    assert runs.final_run_status([S.SUCCEEDED, S.PENDING]) is None
    assert runs.final_run_status([S.SUCCEEDED, S.SUCCEEDED]) is runs.RunStatus.SUCCEEDED
    assert runs.final_run_status([S.SUCCEEDED, S.CANCELLED]) is runs.RunStatus.CANCELLED
    assert runs.final_run_status([S.REJECTED, S.SKIPPED]) is runs.RunStatus.REJECTED
    # A run never reports success for work that failed, even past on_failure: continue.
    assert runs.final_run_status([S.FAILED, S.SUCCEEDED]) is runs.RunStatus.FAILED
    assert runs.final_run_status([S.FAILED, S.CANCELLED]) is runs.RunStatus.FAILED


def test_retry_backoff_grows_and_stops_after_max_attempts():
    policy = retry.RetryPolicy(max_attempts=3, backoff=dt.timedelta(seconds=2), factor=3)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert policy.next_attempt_at(attempt=1, now=now) == now + dt.timedelta(seconds=2)
    assert policy.next_attempt_at(attempt=2, now=now) == now + dt.timedelta(seconds=6)
    assert policy.next_attempt_at(attempt=3, now=now) is None


def test_retry_after_from_the_server_is_honoured():
    policy = retry.RetryPolicy(max_attempts=2, backoff=dt.timedelta(seconds=1))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    at = policy.next_attempt_at(attempt=1, now=now, retry_after=30)
    assert at == now + dt.timedelta(seconds=30)
