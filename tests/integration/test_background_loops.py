"""The leader's periodic loops outlive a pass that fails in any way: the next pass runs."""

from __future__ import annotations

import asyncio

import pytest

import remediator.app as app_mod

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("loop", "pass_name", "interval"),
    [
        (app_mod.expire_approvals_forever, "expire_approvals", "approval_expiry_interval"),
        (app_mod.reconcile_forever, "reconcile", "reconcile_interval"),
    ],
)
async def test_a_pass_that_raises_anything_does_not_end_the_loop(
    make_harness, monkeypatch, loop, pass_name, interval
):
    h = await make_harness(approval_timeout=60, **{interval: 0.01})
    calls = 0

    async def failing() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("a bug in one pass")

    monkeypatch.setattr(h.components, pass_name, failing)
    task = asyncio.create_task(loop(h.components))
    try:
        for _ in range(200):
            if calls >= 3 or task.done():
                break
            await asyncio.sleep(0.01)
        assert not task.done(), task
        assert calls >= 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
