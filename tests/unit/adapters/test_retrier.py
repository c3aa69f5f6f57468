"""``transport.Retrier``: the first attempt runs bare, a retryable failure goes on to
tenacity as its attempt 1, within the same attempts and time budget."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from remediator.adapters.kubernetes import transport
from remediator.adapters.kubernetes.library import ApiException
from remediator.ports import cluster as port


class Calls:
    def __init__(self, *answers: Any, delay: float = 0.0) -> None:
        self.answers = list(answers)
        self.count = 0
        self.delay = delay

    async def __call__(self) -> Any:
        self.count += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def unavailable() -> ApiException:
    return ApiException(status=503, reason="Service Unavailable")


@pytest.fixture
def no_tenacity(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("tenacity was entered")

    monkeypatch.setattr(transport.tenacity, "AsyncRetrying", refuse)


@pytest.mark.usefixtures("no_tenacity")
async def test_a_call_that_succeeds_at_once_never_enters_the_retry_machinery() -> None:
    calls = Calls("node")
    assert await transport.Retrier(max_seconds=30).call("get node", calls) == "node"
    assert calls.count == 1


@pytest.mark.usefixtures("no_tenacity")
async def test_an_answer_that_is_not_retried_is_translated_at_once() -> None:
    calls = Calls(ApiException(status=404, reason="Not Found"))
    with pytest.raises(port.NotFound) as info:
        await transport.Retrier(max_seconds=30).call("get node x", calls)
    assert calls.count == 1
    assert isinstance(info.value.__cause__, ApiException)
    assert str(info.value).startswith("get node x: ")


async def test_a_failed_first_attempt_counts_as_attempt_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "remediator.adapters.kubernetes")
    calls = Calls(unavailable())
    with pytest.raises(port.Unavailable) as info:
        await transport.Retrier(max_seconds=30, attempts=3).call("patch node x", calls)
    assert calls.count == 3  # not 4: the replayed first failure is attempt 1
    assert info.value.status == 503
    assert isinstance(info.value.__cause__, ApiException)
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split(" (attempt ")[1].split(",")[0] for m in logged] == ["1", "2"]
    assert all(m.startswith("kubernetes patch node x failed") for m in logged)


async def test_a_retry_after_a_failed_first_attempt_returns_its_answer() -> None:
    calls = Calls(unavailable(), "node")
    assert await transport.Retrier(max_seconds=30, attempts=3).call("get node", calls) == "node"
    assert calls.count == 2


async def test_the_time_budget_includes_the_first_attempt() -> None:
    # the first attempt alone outlasts the budget: no second one
    calls = Calls(unavailable(), delay=0.3)
    with pytest.raises(port.Unavailable):
        await transport.Retrier(max_seconds=0.25).call("get node", calls)
    assert calls.count == 1


async def test_anything_else_is_raised_as_it_is() -> None:
    bug = ValueError("a request the client could not build")
    with pytest.raises(ValueError, match="could not build") as info:
        await transport.Retrier(max_seconds=30).call("get node", Calls(bug))
    assert info.value is bug
    assert info.value.__cause__ is None
