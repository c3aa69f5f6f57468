from __future__ import annotations

import httpx
import pytest
import respx

from remediator.adapters import notify
from remediator.app import settings
from remediator.domain import errors

URL = "https://hooks.example.test/remediator"


def _notifier(attempts=4):
    channel = settings.NotifyChannel(url=URL, headers={"Authorization": "Bearer x"}, timeout=2)
    return notify.WebhookNotifier({"ops": channel}, attempts=attempts)


@respx.mock
async def test_notification_is_posted_with_an_idempotency_key():
    route = respx.post(URL).mock(return_value=httpx.Response(200))
    out = await _notifier().send(
        channel="ops", message="hot", data={"node": "n1"}, idempotency_key="run-1-step-2"
    )
    assert out["delivered"] is True
    request = route.calls.last.request
    assert request.headers["Idempotency-Key"] == "run-1-step-2"
    assert request.headers["Authorization"] == "Bearer x"
    assert httpx.Response(200, content=request.content).json() == {"message": "hot", "node": "n1"}


@respx.mock
async def test_server_errors_are_retried_then_succeed():
    route = respx.post(URL).mock(
        side_effect=[httpx.Response(503), httpx.ConnectError("boom"), httpx.Response(204)]
    )
    out = await _notifier().send(channel="ops", message="m", data={}, idempotency_key="k")
    assert out["status"] == 204
    assert route.call_count == 3


@respx.mock
async def test_retry_after_is_honoured_on_429(monkeypatch):
    waits = []

    async def fake_sleep(seconds):
        waits.append(seconds)

    monkeypatch.setattr("asyncio.sleep", fake_sleep)
    respx.post(URL).mock(
        side_effect=[httpx.Response(429, headers={"Retry-After": "7"}), httpx.Response(200)]
    )
    await _notifier().send(channel="ops", message="m", data={}, idempotency_key="k")
    assert waits == [7.0]


@respx.mock
async def test_exhausted_retries_are_a_temporary_step_failure():
    route = respx.post(URL).mock(return_value=httpx.Response(502))
    with pytest.raises(errors.ActionFailed) as info:
        await _notifier(attempts=2).send(channel="ops", message="m", data={}, idempotency_key="k")
    assert info.value.temporary
    assert route.call_count == 2


@respx.mock
async def test_client_errors_are_permanent_and_not_retried():
    route = respx.post(URL).mock(return_value=httpx.Response(400, text="bad"))
    with pytest.raises(errors.ActionFailed) as info:
        await _notifier().send(channel="ops", message="m", data={}, idempotency_key="k")
    assert not info.value.temporary
    assert route.call_count == 1


async def test_an_unconfigured_channel_is_recorded_as_not_delivered():
    out = await _notifier().send(channel="nowhere", message="m", data={}, idempotency_key="k")
    assert out["delivered"] is False
    assert "not configured" in out["reason"]
