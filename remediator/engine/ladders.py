"""The store-backed escalation ladder (``ports.ladder``).

A GPU's ladder lives in ``guard_state`` under ``ladder:<node>:<gpu>``: no table of its own,
durable across restarts and replicas, and read-modify-written in one transaction, so two runs
deciding at once cannot both take the same rung. Every decision writes an audit event
(``ladder.climbed`` / ``ladder.escalated`` / ``ladder.declined``) linked to the run.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from remediator.domain import ladders
from remediator.ports import store


class StoreLadder:
    def __init__(self, store_: store.Store) -> None:
        self.store = store_

    async def climb(
        self,
        key: str,
        *,
        run_id: int,
        forget_after: dt.timedelta,
        start: ladders.Rung = ladders.Rung.RESET,
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        def work(tx: store.Tx) -> tuple[ladders.Rung, dict[str, Any]]:
            before = tx.get_guard_state(key)
            rung, after = ladders.climb(
                before, run_id=run_id, now=tx.now, forget_after=forget_after, start=start
            )
            if after != before:
                tx.set_guard_state(key, after)
                tx.add_event(
                    "ladder.climbed",
                    actor="engine",
                    run_id=run_id,
                    reason=after["history"][-1]["reason"],
                    data={"key": key, "rung": rung.value, "previous": before.get("rung")},
                )
            return rung, after

        return await self.store.run("ladder.climb", work)

    async def escalate(
        self, key: str, *, run_id: int, to: ladders.Rung, reason: str
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        def work(tx: store.Tx) -> tuple[ladders.Rung, dict[str, Any]]:
            before = tx.get_guard_state(key)
            rung, after = ladders.escalate(before, run_id=run_id, to=to, now=tx.now, reason=reason)
            if after != before:
                tx.set_guard_state(key, after)
                tx.add_event(
                    "ladder.escalated",
                    actor="engine",
                    run_id=run_id,
                    reason=reason,
                    data={"key": key, "rung": rung.value},
                )
            return rung, after

        return await self.store.run("ladder.escalate", work)

    async def decline(
        self, key: str, *, run_id: int, reason: str
    ) -> tuple[ladders.Rung | None, dict[str, Any]]:
        def work(tx: store.Tx) -> tuple[ladders.Rung | None, dict[str, Any]]:
            before = tx.get_guard_state(key)
            rung, after = ladders.decline(before, run_id=run_id, now=tx.now, reason=reason)
            if after != before:
                tx.set_guard_state(key, after)
                tx.add_event(
                    "ladder.declined",
                    actor="engine",
                    run_id=run_id,
                    reason=reason,
                    data={"key": key, "rung": None},
                )
            return rung, after

        return await self.store.run("ladder.decline", work)

    async def state(self, key: str) -> dict[str, Any]:
        return await self.store.run("ladder.state", lambda tx: tx.get_guard_state(key))
