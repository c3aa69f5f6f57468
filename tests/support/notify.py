"""A notifier that keeps what it was asked to send, for tests of steps that notify."""

from __future__ import annotations

from typing import Any


class FakeNotifier:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(
        self, *, channel: str, message: str, data: dict[str, Any], idempotency_key: str
    ) -> dict[str, Any]:
        self.sent.append(
            {"channel": channel, "message": message, "data": data, "key": idempotency_key}
        )
        return {"delivered": True, "channel": channel}

    def messages(self) -> list[str]:
        return [s["message"] for s in self.sent]
