"""Leader election for the singleton loops (lease sweeper, approval expiry, retention).

``DatabaseLease`` keeps one row per lease name in ``leader_leases``. Every change is one
compare-and-set statement, so two replicas racing for the row get one winner:

- renew or take over: ``UPDATE … WHERE name = :name AND (holder = :me OR expires_at < :now)``;
- first ever: ``INSERT … ON CONFLICT DO NOTHING``;
- release: ``UPDATE … SET expires_at = :now WHERE name = :name AND holder = :me``.

Replicas compare ``expires_at`` with their own clocks: keep them in sync (NTP), as Kubernetes
Leases also require.

``Elector`` drives any ``ports.leader.LeaderLease``: it renews every third of the lease
duration, runs the singleton loops while it leads and cancels them when it stops leading. A
definite loss (someone else holds the lease) stops them at once; when the lease cannot be
reached it stops them one renew interval before its own lease would expire, so two replicas
never run them at the same time as long as clocks agree. Losing leadership never touches
intake or step execution. If a singleton loop raises, ``run`` raises too and the composition
root stops the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from remediator.adapters.db import database, tables
from remediator.domain import errors
from remediator.ports import leader as port

logger = logging.getLogger("remediator.leader")

L = tables.leader_leases
Clock = Callable[[], dt.datetime]
Loop = Callable[[], Coroutine[Any, Any, None]]


class DatabaseLease:
    def __init__(self, db: database.Database, *, name: str, clock: Clock) -> None:
        self.db = db
        self._name = name
        self.clock = clock

    @property
    def name(self) -> str:
        return self._name

    async def acquire_or_renew(self, holder: str, *, duration: float) -> bool:
        now = self.clock()
        expires = now + dt.timedelta(seconds=duration)
        async with self.db.write("leader") as conn:
            renewed = await conn.execute(
                sa.update(L)
                .where(L.c.name == self._name, sa.or_(L.c.holder == holder, L.c.expires_at < now))
                .values(
                    holder=holder,
                    acquired_at=sa.case((L.c.holder == holder, L.c.acquired_at), else_=now),
                    renewed_at=now,
                    expires_at=expires,
                )
            )
            if renewed.rowcount:
                return True
            insert = postgresql.insert(L) if self.db.is_postgres else sqlite.insert(L)
            created = await conn.execute(
                insert.values(
                    name=self._name,
                    holder=holder,
                    acquired_at=now,
                    renewed_at=now,
                    expires_at=expires,
                ).on_conflict_do_nothing(index_elements=[L.c.name])
            )
            return bool(created.rowcount)

    async def release(self, holder: str) -> None:
        async with self.db.write("leader") as conn:
            await conn.execute(
                sa.update(L)
                .where(L.c.name == self._name, L.c.holder == holder)
                .values(expires_at=self.clock())
            )

    async def close(self) -> None:
        return None


class Elector:
    def __init__(
        self,
        lease: port.LeaderLease,
        *,
        holder: str,
        duration: float,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if duration <= 0:
            raise ValueError("lease duration must be positive")
        self.lease = lease
        self.holder = holder
        self.duration = duration
        self.interval = duration / 3
        self.on_change = on_change
        self.is_leader = False
        self._loops: dict[str, Loop] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._valid_until = 0.0
        self._failed = asyncio.Event()
        self._failure: asyncio.Task[None] | None = None

    def add_singleton(self, name: str, loop: Loop) -> None:
        """Run ``loop()`` only while this replica leads (cancelled when it stops leading)."""
        self._loops[name] = loop

    async def step(self) -> None:
        """One renewal attempt and the transition it implies."""
        monotonic = asyncio.get_running_loop().time
        started = monotonic()
        held = await self._attempt()
        if held:
            self._valid_until = started + self.duration
            if not self.is_leader:
                self._start_leading()
        elif self.is_leader and (held is False or monotonic() >= self._valid_until - self.interval):
            await self._stop_leading("lost the lease" if held is False else "unreachable")

    async def run(self) -> None:
        try:
            while True:
                await self.step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._failed.wait(), self.interval)
                self._raise_if_a_loop_failed()
        finally:
            await self._cancel_loops()

    async def _attempt(self) -> bool | None:
        """True: held; False: held by someone else; None: could not tell."""
        try:
            async with asyncio.timeout(self.interval):
                return await self.lease.acquire_or_renew(self.holder, duration=self.duration)
        except (errors.RemediatorError, TimeoutError, OSError) as e:
            logger.warning("leader lease %s not renewed: %s", self.lease.name, e)
            return None

    def _start_leading(self) -> None:
        logger.info("%s leads %s", self.holder, self.lease.name)
        self.is_leader = True
        self._notify()
        for name, loop in self._loops.items():
            task = asyncio.create_task(loop(), name=f"leader:{name}")
            task.add_done_callback(self._on_loop_done)
            self._tasks.append(task)

    async def _stop_leading(self, why: str) -> None:
        logger.warning("%s stops leading %s: %s", self.holder, self.lease.name, why)
        self.is_leader = False
        self._notify()
        await self._cancel_loops()

    async def _cancel_loops(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and self._failure is None:
            self._failure = task
            self._failed.set()

    def _raise_if_a_loop_failed(self) -> None:
        task = self._failure
        if task is not None:
            error = task.exception()
            raise RuntimeError(f"singleton loop {task.get_name()} stopped: {error!r}") from error

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change(self.is_leader)

    async def stop(self) -> None:
        """Stop the singleton loops and hand the lease over at once (graceful shutdown)."""
        was_leader = self.is_leader
        if was_leader:
            self.is_leader = False
            self._notify()
        await self._cancel_loops()
        if was_leader:
            with contextlib.suppress(errors.RemediatorError, TimeoutError, OSError):
                async with asyncio.timeout(self.interval):
                    await self.lease.release(self.holder)
        await self.lease.close()


class Unopposed:
    """``leader_election: off``: a lease this replica always holds (one replica only)."""

    name = "unopposed"

    async def acquire_or_renew(self, holder: str, *, duration: float) -> bool:
        return True

    async def release(self, holder: str) -> None:
        return None

    async def close(self) -> None:
        return None
