"""Leases to elect a leader with: the database row (SQLite, Postgres) and a Kubernetes Lease in
the simulator, behind one factory so every test runs against each."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from remediator.adapters import kubernetes, leader
from remediator.adapters.db import database, migrate
from remediator.adapters.kubernetes import leases as kube_leases
from remediator.ports import leader as leader_port
from remediator.sim import testing

LeaseFactory = Callable[..., Awaitable[leader_port.LeaderLease]]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.fixture(params=["sqlite", "postgres", "kubernetes"])
async def make_lease(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[LeaseFactory]:
    """``await make_lease(clock=...)``: another handle on the same named lease."""
    made: list[leader_port.LeaderLease] = []
    if request.param == "kubernetes":
        async with testing.running_sim() as sim:
            settings = kubernetes.KubernetesConfig(
                mode="kubeconfig", kubeconfig=str(sim.kubeconfig_path)
            )

            async def make_kube(clock: Callable[[], dt.datetime] = utcnow) -> Any:
                lease = await kube_leases.connect(settings, name="remediator", namespace="default")
                lease.clock = clock
                made.append(lease)
                return lease

            yield make_kube
            for lease in made:
                await lease.close()
        return
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'leader.db'}"
        urls = iter([url])
    else:
        from tests.conftest import fresh_pg_database

        urls = fresh_pg_database()
        url = next(urls)
    dbs: list[database.Database] = []
    first = database.Database(url)
    await migrate.upgrade(first)
    dbs.append(first)

    async def make_db(clock: Callable[[], dt.datetime] = utcnow) -> Any:
        db = database.Database(url)  # one engine per "replica", as separate processes have
        dbs.append(db)
        return leader.DatabaseLease(db, name="remediator", clock=clock)

    yield make_db
    for db in dbs:
        await db.dispose()
    for _ in urls:  # drops the Postgres database
        pass
