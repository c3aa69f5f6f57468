"""Notifications over HTTP (httpx), with transport retries (tenacity) inside the adapter only.

A channel is a URL receiving a JSON post. Connection errors, timeouts, 429 (honouring
``Retry-After``) and 5xx are retried a bounded number of times; any other 4xx is a permanent
failure. What the engine sees is ``errors.ActionFailed``, never an httpx exception.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
import tenacity

from remediator.domain import errors

logger = logging.getLogger("remediator.notify")


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    return min(float(value), 30.0) if value.isdigit() else None


def _wait(state: tenacity.RetryCallState) -> float:
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, _Retryable) and error.retry_after is not None:
        return error.retry_after
    return float(tenacity.wait_exponential(multiplier=0.2, max=5)(state))


class WebhookNotifier:
    def __init__(
        self,
        channels: Mapping[str, Any],
        *,
        client: httpx.AsyncClient | None = None,
        attempts: int = 4,
    ) -> None:
        self.channels = dict(channels)
        self.client = client or httpx.AsyncClient()
        self.attempts = attempts

    async def send(
        self, *, channel: str, message: str, data: dict[str, Any], idempotency_key: str
    ) -> dict[str, Any]:
        config = self.channels.get(channel)
        if config is None:
            logger.info("notification (channel %s not configured): %s", channel, message)
            return {
                "delivered": False,
                "channel": channel,
                "message": message,
                "reason": f"channel {channel!r} is not configured; logged only",
            }
        body = {"message": message, **data}
        headers = {"Idempotency-Key": idempotency_key, **dict(config.headers)}
        try:
            status = await self._post(str(config.url), body, headers, float(config.timeout))
        except _Retryable as e:
            raise errors.ActionFailed(
                f"notification to {channel} failed after {self.attempts} attempts: {e}",
                temporary=True,
            ) from e
        return {"delivered": True, "channel": channel, "status": status, "message": message}

    async def _post(
        self, url: str, body: dict[str, Any], headers: dict[str, str], timeout: float
    ) -> int:
        async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=_wait,
            retry=tenacity.retry_if_exception_type(_Retryable),
            reraise=True,
        ):
            with attempt:
                try:
                    response = await self.client.post(
                        url, json=body, headers=headers, timeout=timeout
                    )
                except httpx.TransportError as e:
                    raise _Retryable(f"{type(e).__name__}: {e}") from e
                if response.status_code == 429 or response.status_code >= 500:
                    raise _Retryable(f"HTTP {response.status_code}", _retry_after(response))
                if response.status_code >= 400:
                    raise errors.ActionFailed(
                        f"notification refused: HTTP {response.status_code} {response.text[:200]}"
                    )
                return response.status_code
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self.client.aclose()
