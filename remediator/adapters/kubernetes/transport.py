"""Transport retries (tenacity) and the translation of library errors into ``ports.cluster``.

Retried, within ``attempts`` and ``max_seconds``: 429 (after its Retry-After), 500/502/503/504,
connection errors and client timeouts. Never retried: other 4xx (409 is the caller's to handle
with a fresh read). A 429 that a PodDisruptionBudget caused is an answer, not congestion, so the
eviction call passes its own predicate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import tenacity
from kubernetes_asyncio.client import exceptions as k8s_exceptions

from remediator.ports import cluster as port

logger = logging.getLogger("remediator.adapters.kubernetes")

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 30.0


def body_of(e: BaseException) -> dict[str, Any]:
    raw = getattr(e, "body", None)
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"message": raw[:500]}
    return parsed if isinstance(parsed, dict) else {}


def status_of(e: BaseException) -> int | None:
    if isinstance(e, k8s_exceptions.ApiException):
        return int(e.status) if e.status else None
    if isinstance(e, aiohttp.WSServerHandshakeError):
        return e.status
    return None


def retry_after_of(e: BaseException) -> float | None:
    headers = getattr(e, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        value = (body_of(e).get("details") or {}).get("retryAfterSeconds")
    try:
        return min(float(value), MAX_RETRY_AFTER) if value is not None else None
    except (TypeError, ValueError):
        return None


def is_transient(e: BaseException) -> bool:
    status = status_of(e)
    if status is not None:
        return status in RETRY_STATUSES
    return isinstance(e, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | TimeoutError)


def is_pdb_refusal(e: BaseException) -> bool:
    """The eviction 429 that means "a disruption budget forbids it", not "slow down"."""
    if status_of(e) != 429:
        return False
    body = body_of(e)
    causes = (body.get("details") or {}).get("causes") or []
    if any(c.get("reason") == "DisruptionBudget" for c in causes if isinstance(c, dict)):
        return True
    return "disruption budget" in str(body.get("message", "")).lower()


def translate(e: BaseException, what: str) -> port.ClusterError:
    status = status_of(e)
    body = body_of(e)
    message = str(body.get("message") or getattr(e, "reason", None) or e or type(e).__name__)
    text = f"{what}: {message}"
    reason = body.get("reason")
    kwargs: dict[str, Any] = {"status": status, "reason": reason}
    if status is None:
        return port.Unavailable(f"{what}: {type(e).__name__}: {e}".rstrip(": "), **kwargs)
    if status == 404:
        return port.NotFound(text, **kwargs)
    if status == 409:
        return port.Conflict(text, **kwargs)
    if status in (401, 403):
        return port.Forbidden(text, **kwargs)
    if status == 429:
        return port.TooManyRequests(text, retry_after=retry_after_of(e), **kwargs)
    if status >= 500:
        return port.Unavailable(text, retry_after=retry_after_of(e), **kwargs)
    if status in (400, 422):
        return port.Invalid(text, **kwargs)
    return port.ClusterError(text, **kwargs)


class Retrier:
    def __init__(self, *, attempts: int, max_seconds: float) -> None:
        self.attempts = attempts
        self.max_seconds = max_seconds
        self._backoff = tenacity.wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        after = retry_after_of(exc) if exc is not None else None
        return after if after is not None else float(self._backoff(state))

    async def call(
        self,
        what: str,
        fn: Callable[[], Awaitable[T]],
        *,
        retryable: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """Run ``fn`` with bounded retries; raise ``port.ClusterError`` (chained) on failure."""

        def log(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            logger.warning(
                "kubernetes %s failed (attempt %d, status %s); retrying in %.2fs",
                what,
                state.attempt_number,
                status_of(exc) if exc else None,
                state.upcoming_sleep,
            )

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(retryable),
            stop=tenacity.stop_after_attempt(self.attempts)
            | tenacity.stop_before_delay(self.max_seconds),
            wait=self._wait,
            before_sleep=log,
            reraise=True,
        )

        async def attempt() -> T:
            return await fn()

        try:
            return await retrying(attempt)
        except port.ClusterError:
            raise
        except (k8s_exceptions.ApiException, aiohttp.ClientError, TimeoutError) as e:
            raise translate(e, what) from e
