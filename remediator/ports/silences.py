"""Alertmanager silences (API v2), implemented by ``adapters.alertmanager``."""

from __future__ import annotations

import datetime as dt
from typing import Protocol


class Silencer(Protocol):
    async def create(
        self,
        *,
        matchers: dict[str, str],
        starts_at: dt.datetime,
        ends_at: dt.datetime,
        comment: str,
    ) -> str:
        """Create a silence matching these label values exactly; return its id."""
        ...

    async def expire(self, silence_id: str) -> None: ...
