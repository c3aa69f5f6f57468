"""Step retry decisions (persisted by the engine, so they survive restarts).

Transport retries (a 503 from the API server, a reset connection) happen inside adapters with
tenacity for a few seconds; this is the second level: a step whose action reported a
*temporary* failure is scheduled again after a delay. Real outages last longer than a fixed
small count of attempts (an API server restart, a control-plane upgrade), so the budget is
time: a temporary failure is retried until ``retry_for`` has passed since the step's first
attempt, and at least ``max_attempts`` attempts are made whatever the time. The backoff is
capped low (``max_backoff``) so that the step resumes soon after the outage ends.
"""

from __future__ import annotations

import datetime as dt

import pydantic

from remediator.domain import durations


class RetryPolicy(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = pydantic.Field(
        default=3, ge=1, le=100, description="Attempts made whatever the time they take."
    )
    retry_for: durations.Duration = pydantic.Field(
        default=dt.timedelta(minutes=5),
        description="Temporary failures are retried until this long after the first attempt.",
    )
    backoff: durations.Duration = dt.timedelta(seconds=5)
    factor: float = pydantic.Field(default=2.0, ge=1.0, le=10.0)
    max_backoff: durations.Duration = dt.timedelta(seconds=30)

    def next_attempt_at(
        self,
        *,
        attempt: int,
        now: dt.datetime,
        first_attempt_at: dt.datetime | None = None,
        retry_after: float | None = None,
    ) -> dt.datetime | None:
        """When attempt ``attempt + 1`` should start, or ``None`` once the budget is spent:
        ``max_attempts`` made and ``retry_for`` passed since ``first_attempt_at``."""
        delay = self.backoff.total_seconds() * self.factor ** max(attempt - 1, 0)
        delay = min(delay, self.max_backoff.total_seconds())
        if retry_after is not None:
            delay = max(delay, retry_after)
        at = now + dt.timedelta(seconds=delay)
        if attempt < self.max_attempts:
            return at
        if first_attempt_at is not None and at - first_attempt_at <= self.retry_for:
            return at
        return None
