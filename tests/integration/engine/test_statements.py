"""The statements an engine pass runs are built once, not per call: building a query (and its
cache key) cost more CPU than running it, and a pass ran two dozen of them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, migrate
from remediator.adapters.db import store as sql_store
from tests.contract.plans import new_run

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


async def test_the_reads_and_writes_of_a_pass_build_no_statement(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    try:
        run_id = await store.run("prepare", lambda tx: tx.insert_run(new_run(), actor="test"))
        built: list[str] = []
        for name in ("select", "update", "insert", "delete", "exists"):
            made = getattr(sa, name)

            def counting(*args: Any, _made: Any = made, _name: str = name, **kw: Any) -> Any:
                built.append(_name)
                return _made(*args, **kw)

            monkeypatch.setattr(sa, name, counting)

        def one_pass(tx: sql_store.SqlTx) -> None:
            tx.lock_unhandled_episodes(64)
            tx.lock_pending_runs(64)
            tx.active_runs_with_no_active_step(64)
            tx.lock_due_steps(64)
            for pool in (None, "pool-a"):
                tx.guard_snapshot(
                    node="gpu-node-03",
                    since=NOW - dt.timedelta(hours=1),
                    disruptive_playbooks=["reboot"],
                    gpu_nodes=8,
                    pool=pool,
                )
            tx.held_keys("slot:reboot:")
            tx.record_disruption(run_id=run_id, node="gpu-node-03")
            tx.get_guard_state("breaker")

        await store.run("pass", one_pass)
        await store.probe()
        assert built == []
    finally:
        await db.dispose()
