"""Alertmanager API v2 over httpx: silences while a disruptive run is active.

Transport errors, 429 and 5xx are retried (tenacity, bounded); a 400 (Alertmanager refuses the
silence, e.g. an end in the past) is a permanent error. Errors surface as ``RemediatorError``.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import tenacity

from remediator.domain import errors

if TYPE_CHECKING:
    import httpx


class AlertmanagerError(errors.RemediatorError):
    code = "alertmanager"


class _Retry(Exception):
    pass


class AlertmanagerSilencer:
    def __init__(
        self, base_url: str, *, client: httpx.AsyncClient | None = None, attempts: int = 3
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self.attempts = attempts

    @property
    def client(self) -> httpx.AsyncClient:
        """Made for the first silence (httpx is imported only by a server that silences)."""
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=10)
        return self._client

    async def _request(self, method: str, path: str, *, json: Any = None) -> httpx.Response:
        import httpx

        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(self.attempts),
                wait=tenacity.wait_exponential(multiplier=0.2, max=3),
                retry=tenacity.retry_if_exception_type(_Retry),
                reraise=True,
            ):
                with attempt:
                    try:
                        response = await self.client.request(
                            method, f"{self.base_url}{path}", json=json
                        )
                    except httpx.TransportError as e:
                        raise _Retry(f"{type(e).__name__}: {e}") from e
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _Retry(f"HTTP {response.status_code}")
                    return response
        except _Retry as e:
            raise AlertmanagerError(f"Alertmanager {method} {path} failed: {e}") from e
        raise AssertionError("unreachable")

    async def create(
        self,
        *,
        matchers: dict[str, str],
        starts_at: dt.datetime,
        ends_at: dt.datetime,
        comment: str,
    ) -> str:
        body = {
            "matchers": [
                {"name": name, "value": value, "isRegex": False, "isEqual": True}
                for name, value in sorted(matchers.items())
            ],
            "startsAt": starts_at.isoformat(),
            "endsAt": ends_at.isoformat(),
            "createdBy": "remediator",
            "comment": comment,
        }
        response = await self._request("POST", "/api/v2/silences", json=body)
        if response.status_code != 200:
            raise AlertmanagerError(
                f"Alertmanager refused the silence: HTTP {response.status_code} "
                f"{response.text[:200]}"
            )
        return str(response.json()["silenceID"])

    async def expire(self, silence_id: str) -> None:
        response = await self._request("DELETE", f"/api/v2/silence/{silence_id}")
        if response.status_code not in (200, 404):
            raise AlertmanagerError(f"cannot expire silence {silence_id}: {response.status_code}")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
