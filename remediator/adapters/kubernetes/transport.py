"""Transport retries (tenacity) and the translation of library errors into ``ports.cluster``.

Retried with backoff for at most ``max_seconds`` (and, if set, ``attempts``): 429 (after its
Retry-After), 500/502/503/504, connection errors (refused, reset, DNS, server disconnects),
client timeouts and websocket handshakes that did not upgrade. Never retried: other 4xx (409 is
the caller's to handle with a fresh read). A 429 that a PodDisruptionBudget caused, and the 500
that says several budgets select a pod, are answers, not congestion, so the eviction call
passes its own predicate. Whatever outlasts the retries and may pass later is translated into a
``ClusterError`` whose ``temporary`` is true; only definite answers are permanent.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import aiohttp
import tenacity

from remediator.adapters.kubernetes.library import ApiException
from remediator.ports import cluster as port

logger = logging.getLogger("remediator.adapters.kubernetes")

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 30.0
MAX_BACKOFF = 5.0
MULTIPLE_BUDGETS = "more than one poddisruptionbudget"
TRANSIENT_ERRORS = (
    aiohttp.ClientConnectionError,  # refused, reset, DNS, server disconnected, client timeouts
    aiohttp.ClientPayloadError,
    ConnectionError,
    TimeoutError,
)


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
    if isinstance(e, ApiException):
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


def is_failed_upgrade(e: BaseException) -> bool:
    """A websocket handshake the server (or a proxy) answered without upgrading or refusing."""
    return isinstance(e, aiohttp.WSServerHandshakeError) and (e.status or 0) < 400


def is_transient(e: BaseException) -> bool:
    if is_failed_upgrade(e):
        return True
    status = status_of(e)
    if status is not None:
        return status in RETRY_STATUSES
    return isinstance(e, TRANSIENT_ERRORS)


def is_pdb_refusal(e: BaseException) -> bool:
    """The eviction 429 that means "a disruption budget forbids it", not "slow down"."""
    if status_of(e) != 429:
        return False
    body = body_of(e)
    causes = (body.get("details") or {}).get("causes") or []
    if any(c.get("reason") == "DisruptionBudget" for c in causes if isinstance(c, dict)):
        return True
    return "disruption budget" in str(body.get("message", "")).lower()


def is_multiple_budgets(e: BaseException) -> bool:
    """The eviction 500 that means "several budgets select this pod" (an answer, not a fault)."""
    return status_of(e) == 500 and MULTIPLE_BUDGETS in str(body_of(e).get("message", "")).lower()


def translate(e: BaseException, what: str) -> port.ClusterError:
    status = status_of(e)
    body = body_of(e)
    message = str(body.get("message") or getattr(e, "reason", None) or e or type(e).__name__)
    text = f"{what}: {message}"
    reason = body.get("reason")
    kwargs: dict[str, Any] = {"status": status, "reason": reason}
    if is_failed_upgrade(e):
        return port.Unavailable(f"{what}: websocket handshake failed: {message}", **kwargs)
    if status is None:
        text = f"{what}: {type(e).__name__}: {e}".rstrip(": ")
        if isinstance(e, TRANSIENT_ERRORS):
            return port.Unavailable(text, **kwargs)
        return port.ClusterError(text, **kwargs)  # e.g. a request the client could not build
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
    def __init__(self, *, max_seconds: float, attempts: int | None = None) -> None:
        self.attempts = attempts
        self.max_seconds = max_seconds
        self._backoff = tenacity.wait_exponential_jitter(
            multiplier=0.2, max=MAX_BACKOFF, jitter=0.2
        )

    def _stop(self, spent: float = 0.0) -> tenacity.stop.stop_base:
        stop: tenacity.stop.stop_base = tenacity.stop_before_delay(self.max_seconds - spent)
        if self.attempts is not None:
            stop = stop | tenacity.stop_after_attempt(self.attempts)
        return stop

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
        """Run ``fn``, retrying what ``retryable`` accepts for a bounded time; raise
        ``port.ClusterError`` (chained) on failure.

        The first attempt runs bare: nearly every call succeeds at once, and tenacity's
        machinery (built per call) cost a fifth of a cordon's Kubernetes call. Only a first
        attempt that failed with something ``retryable`` accepts goes on to tenacity, which
        counts it as its attempt 1 (same logging, backoff and Retry-After) within the same
        time budget."""
        started = time.monotonic()
        try:
            return await fn()
        except Exception as e:
            if not retryable(e):
                _fail(e, what)
            first: list[Exception] = [e]

        def log(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            status = status_of(exc) if exc is not None else None
            logger.warning(
                "kubernetes %s failed (attempt %d, %s); retrying in %.2fs",
                what,
                state.attempt_number,
                f"status {status}" if status else type(exc).__name__,
                state.upcoming_sleep,
            )

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(retryable),
            stop=self._stop(time.monotonic() - started),
            wait=self._wait,
            before_sleep=log,
            reraise=True,
        )

        async def attempt() -> T:
            if first:  # attempt 1 already ran: its failure, replayed
                raise first.pop()
            return await fn()

        try:
            return await retrying(attempt)
        except Exception as e:
            _fail(e, what)


def _fail(e: Exception, what: str) -> NoReturn:
    """Raise what a call that failed with ``e`` raises: a library error translated (chained),
    anything else (a ``ClusterError`` already, a bug) as it is."""
    if isinstance(e, ApiException | aiohttp.ClientError | ConnectionError | TimeoutError):
        raise translate(e, what) from e
    raise e
