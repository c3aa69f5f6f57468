"""Step retry decisions (persisted by the engine, so they survive restarts).

Transport retries (a 503 from the API server, a reset connection) happen inside adapters with
tenacity and never reach here; this is the second level: a step whose action reported a
*temporary* failure is scheduled again after a delay, up to ``max_attempts`` in total.
"""

from __future__ import annotations

import datetime as dt

import pydantic

from remediator.domain import durations


class RetryPolicy(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = pydantic.Field(default=3, ge=1, le=100)
    backoff: durations.Duration = dt.timedelta(seconds=5)
    factor: float = pydantic.Field(default=2.0, ge=1.0, le=10.0)
    max_backoff: durations.Duration = dt.timedelta(minutes=5)

    def next_attempt_at(
        self, *, attempt: int, now: dt.datetime, retry_after: float | None = None
    ) -> dt.datetime | None:
        """When attempt ``attempt + 1`` should start, or ``None`` if attempts are used up."""
        if attempt >= self.max_attempts:
            return None
        delay = self.backoff.total_seconds() * self.factor ** max(attempt - 1, 0)
        delay = min(delay, self.max_backoff.total_seconds())
        if retry_after is not None:
            delay = max(delay, retry_after)
        return now + dt.timedelta(seconds=delay)
