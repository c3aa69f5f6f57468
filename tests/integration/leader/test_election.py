"""Electors on one lease (Postgres row or simulator Lease), in real time with short leases:
one leader at a time, singleton loops only on the leader, and a dead leader's loops move to
another replica within one lease duration (plus one retry interval)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from remediator.adapters import leader
from remediator.domain import errors

DURATION = 2.0  # Kubernetes Leases count whole seconds
# The first election waits for each replica's first connection (a fresh engine, a fresh
# database), which a loaded machine can stretch past a lease; these tests time the handovers,
# so the first leader gets longer.
FIRST_ELECTION = DURATION * 5


class Replica:
    def __init__(self, name: str, lease) -> None:
        self.ticks = 0
        self.elector = leader.Elector(lease, holder=name, duration=DURATION)
        self.elector.add_singleton("count", self._count)
        self.task: asyncio.Task[None] | None = None

    async def _count(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.05)

    def start(self) -> Replica:
        self.task = asyncio.create_task(self.elector.run())
        return self

    async def crash(self) -> None:
        """Stop renewing without releasing (SIGKILL, partition)."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.elector.is_leader = False

    @property
    def leads(self) -> bool:
        return self.elector.is_leader


async def _leaders(replicas: list[Replica], *, for_seconds: float) -> set[int]:
    """Sample who leads; fail if two ever lead at once."""
    seen: set[int] = set()
    loop = asyncio.get_running_loop()
    end = loop.time() + for_seconds
    while loop.time() < end:
        leading = [i for i, r in enumerate(replicas) if r.leads]
        assert len(leading) <= 1, f"two leaders at once: {leading}"
        seen.update(leading)
        await asyncio.sleep(0.02)
    return seen


async def _wait_for_leader(replicas: list[Replica], timeout: float) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(timeout):
        while True:
            leading = [i for i, r in enumerate(replicas) if r.leads]
            assert len(leading) <= 1, f"two leaders at once: {leading}"
            if leading:
                return leading[0], loop.time() - started
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("make_lease", ["postgres", "kubernetes"], indirect=True)
async def test_one_leader_runs_the_singleton_loops_and_a_dead_leaders_move_within_a_lease(
    make_lease,
):
    replicas = [Replica(f"r{i}", await make_lease()).start() for i in range(3)]
    try:
        first, _ = await _wait_for_leader(replicas, FIRST_ELECTION)
        assert await _leaders(replicas, for_seconds=DURATION * 1.5) == {first}
        assert replicas[first].ticks > 0
        assert all(r.ticks == 0 for i, r in enumerate(replicas) if i != first)

        await replicas[first].crash()
        second, took = await _wait_for_leader(replicas, DURATION * 3)
        assert second != first
        assert took <= DURATION + DURATION / 3 + 0.5, took
        ticks = replicas[second].ticks
        await asyncio.sleep(0.3)
        assert replicas[second].ticks > ticks
    finally:
        for replica in replicas:
            await replica.crash()


@pytest.mark.parametrize("make_lease", ["postgres", "kubernetes"], indirect=True)
async def test_a_leader_that_stops_gracefully_hands_over_at_once(make_lease):
    replicas = [Replica(f"r{i}", await make_lease()).start() for i in range(2)]
    try:
        first, _ = await _wait_for_leader(replicas, FIRST_ELECTION)
        task = replicas[first].task
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await replicas[first].elector.stop()
        second, took = await _wait_for_leader(replicas, DURATION)
        assert second != first
        assert took <= DURATION / 3 + 0.5
    finally:
        for replica in replicas:
            await replica.crash()


class Unreachable:
    """A lease whose backend stopped answering after the first renewal."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    async def acquire_or_renew(self, holder: str, *, duration: float) -> bool:
        self.calls += 1
        if self.calls > 1:
            raise errors.StoreUnavailable("database unavailable: connection refused")
        return True

    async def release(self, holder: str) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_a_leader_that_cannot_renew_stops_its_loops_before_its_lease_expires():
    replica = Replica("r", Unreachable()).start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await asyncio.sleep(0.1)
        assert replica.leads
        async with asyncio.timeout(DURATION):
            while replica.leads:
                await asyncio.sleep(0.02)
        assert loop.time() - started < DURATION
        ticks = replica.ticks
        await asyncio.sleep(0.2)
        assert replica.ticks == ticks
    finally:
        await replica.crash()


async def test_a_failing_singleton_loop_stops_the_elector():
    elector = leader.Elector(leader.Unopposed(), holder="r", duration=DURATION)

    async def broken() -> None:
        raise ValueError("bug")

    elector.add_singleton("broken", broken)
    with pytest.raises(RuntimeError, match="broken"):
        async with asyncio.timeout(DURATION):
            await elector.run()
