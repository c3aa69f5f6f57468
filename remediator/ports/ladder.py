"""Durable per-GPU escalation ladders (see ``domain.ladders``), for the actions that climb them.

The composition root puts an implementation in ``ActionContext.services["ladder"]``. Each call
is one read-modify-write in one transaction and writes an audit event for the run.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

from remediator.domain import ladders

SERVICE = "ladder"


class Ladder(Protocol):
    async def climb(
        self,
        key: str,
        *,
        run_id: int,
        forget_after: dt.timedelta,
        start: ladders.Rung = ladders.Rung.RESET,
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        """This run's rung (decided now, or the one decided before) and the ladder state."""
        ...

    async def escalate(
        self, key: str, *, run_id: int, to: ladders.Rung, reason: str
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        """Raise this run's rung to at least ``to``."""
        ...

    async def decline(
        self, key: str, *, run_id: int, reason: str
    ) -> tuple[ladders.Rung | None, dict[str, Any]]:
        """Put this run on no rung unless it has one (``ladders.decline``)."""
        ...

    async def state(self, key: str) -> dict[str, Any]: ...
