"""The lease contract, on the database (SQLite, Postgres) and on a Kubernetes Lease."""

from __future__ import annotations

import asyncio

from tests.conftest import FakeClock


async def test_the_first_candidate_takes_a_free_lease_and_renews_it(make_lease):
    clock = FakeClock()
    lease = await make_lease(clock=clock)
    assert await lease.acquire_or_renew("a", duration=10)
    clock.advance(5)
    assert await lease.acquire_or_renew("a", duration=10)


async def test_a_held_lease_is_refused_until_it_expires(make_lease):
    clock = FakeClock()
    a, b = await make_lease(clock=clock), await make_lease(clock=clock)
    assert await a.acquire_or_renew("a", duration=10)
    clock.advance(9)
    assert not await b.acquire_or_renew("b", duration=10)
    clock.advance(2)
    assert await b.acquire_or_renew("b", duration=10)
    assert not await a.acquire_or_renew("a", duration=10)


async def test_a_renewal_extends_the_lease_from_now(make_lease):
    clock = FakeClock()
    a, b = await make_lease(clock=clock), await make_lease(clock=clock)
    assert await a.acquire_or_renew("a", duration=10)
    clock.advance(8)
    assert await a.acquire_or_renew("a", duration=10)
    clock.advance(8)
    assert not await b.acquire_or_renew("b", duration=10)


async def test_a_released_lease_is_free_at_once(make_lease):
    clock = FakeClock()
    a, b = await make_lease(clock=clock), await make_lease(clock=clock)
    assert await a.acquire_or_renew("a", duration=10)
    await b.release("b")  # not the holder: changes nothing
    assert not await b.acquire_or_renew("b", duration=10)
    await a.release("a")
    clock.advance(1)
    assert await b.acquire_or_renew("b", duration=10)


async def test_candidates_racing_for_a_free_lease_get_one_winner(make_lease):
    clock = FakeClock()
    leases = [await make_lease(clock=clock) for _ in range(4)]
    results = await asyncio.gather(
        *(lease.acquire_or_renew(f"c{i}", duration=10) for i, lease in enumerate(leases))
    )
    assert sum(results) == 1
