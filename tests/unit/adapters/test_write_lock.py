from __future__ import annotations


async def test_the_write_lock_serves_urgent_waiters_first_and_survives_cancellation():
    import asyncio

    from remediator.adapters.db import database

    lock = database.WriteLock()
    order = []

    async def take(name, urgent):
        async with lock.hold(urgent=urgent):
            order.append(name)
            await asyncio.sleep(0)

    async with lock.hold():
        engine = asyncio.create_task(take("engine", False))
        cancelled = asyncio.create_task(take("cancelled", True))
        intake = asyncio.create_task(take("intake", True))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
    await asyncio.gather(engine, intake, return_exceptions=True)
    assert order == ["intake", "engine"]
    async with lock.hold():  # free again
        order.append("after")
    assert order[-1] == "after"
