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


async def test_the_write_lock_counts_urgent_waiters_for_the_holder_to_see():
    import asyncio

    from remediator.adapters.db import database

    lock = database.WriteLock()
    seen = []

    async def take(urgent):
        async with lock.hold(urgent=urgent):
            seen.append(lock.urgent_waiting)

    async with lock.hold():
        tasks = [asyncio.create_task(take(urgent)) for urgent in (False, True, True)]
        await asyncio.sleep(0)
        assert lock.urgent_waiting == 2
        tasks[2].cancel()
        await asyncio.sleep(0)
        assert lock.urgent_waiting == 1
    await asyncio.gather(*tasks, return_exceptions=True)
    assert seen == [0, 0]  # the urgent one went first; nobody waits once it holds the lock
    assert lock.urgent_waiting == 0


async def test_background_waiters_get_the_lock_only_when_no_one_else_waits():
    import asyncio

    from remediator.adapters.db import database

    lock = database.WriteLock()
    order = []

    async def take(name, **kind):
        async with lock.hold(**kind):
            order.append(name)
            await asyncio.sleep(0)

    async with lock.hold():
        tasks = [asyncio.create_task(take("retention", background=True))]
        await asyncio.sleep(0)
        tasks += [
            asyncio.create_task(take("engine")),
            asyncio.create_task(take("intake", urgent=True)),
        ]
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["intake", "engine", "retention"]
