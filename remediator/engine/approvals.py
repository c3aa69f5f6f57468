"""Approvals: who may move a waiting step, and how many must agree.

A step that ``requires_approval`` parks in ``waiting_approval`` (its run too). Each decision is
a row in ``approvals`` (unique per step and principal) written in the same transaction as the
transition it may cause, so:

- a principal decides a step at most once: a second approve by the same principal is a
  ``Conflict``, whatever happened meanwhile;
- a step with ``approvals: N`` moves to ``pending`` when the N-th *distinct* principal approves;
  the transition is a compare-and-set, so concurrent approvals yield exactly one transition
  (the losers see a step that is no longer waiting: ``Conflict``);
- one rejection rejects the run;
- the principal who triggered a manual run cannot approve its steps (they may reject them);
- with ``approval_forbid_alert_sender`` (the default), neither can the principal whose token
  delivered the alert that started a run (the episode's first delivery): a token that may both
  send alerts and approve cannot start a disruptive run and wave it through. Without a tokens
  file every caller is ``anonymous`` and the rule has no one to tell apart; a delivery deleted
  by retention leaves no sender to compare;
- a step that waited longer than the configured timeout expires with the configured outcome
  (``reject`` or ``cancel``), decided by the engine and audited as such.

Crash safety is the transaction's: a decision either committed with its event or never
happened.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, Protocol

from remediator.domain import records
from remediator.ports import store


class ExpiryOutcome(enum.StrEnum):
    REJECT = "reject"
    CANCEL = "cancel"


class Decision(enum.StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"


class ApprovalTx(store.Tx, Protocol):
    """The store operations approvals need on top of the engine's unit of work."""

    def add_approval(
        self, step_id: int, *, principal: str, decision: str, comment: str
    ) -> bool: ...

    def approvals_of(self, step_id: int) -> list[dict[str, Any]]: ...

    def steps_waiting_since(self, cutoff: dt.datetime, limit: int) -> list[records.Step]: ...

    def alert_sender(self, episode_id: int) -> str | None:
        """The principal whose delivery started the episode (None: unknown or deleted)."""
        ...


def approvers(decisions: list[dict[str, Any]]) -> list[str]:
    """Distinct principals who approved, in the order they did."""
    return [row["principal"] for row in decisions if row["decision"] == Decision.APPROVED.value]
