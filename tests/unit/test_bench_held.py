"""The held stage reads the steps the budget holds from the server's own gauge."""

from __future__ import annotations

from bench import held
from remediator.adapters import metrics


def test_the_steps_the_budget_holds_are_read_from_the_exposition():
    m = metrics.Metrics()
    assert held.held_in(m.render().decode()) == 0
    m.set_state(
        metrics.State(
            approvals_pending=1,
            approval_oldest_age=0.0,
            breaker_open=False,
            budget_nodes_in_use=10,
            held=(("budget", 2990), ("driver_upgrade", 3)),
            waiting=(),
        )
    )
    assert held.held_in(m.render().decode()) == 2990
