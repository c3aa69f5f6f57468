"""Outbound notifications (webhooks, chat), implemented by an adapter over httpx."""

from __future__ import annotations

from typing import Any, Protocol


class Notifier(Protocol):
    async def send(
        self, *, channel: str, message: str, data: dict[str, Any], idempotency_key: str
    ) -> dict[str, Any]:
        """Deliver one notification; return what was delivered (for the step output)."""
