"""The store-backed escalation ladder (``ports.ladder``).

A GPU's ladder lives in ``guard_state`` under ``ladder:<node>:<gpu>``: no table of its own,
durable across restarts and replicas, and read-modify-written in one transaction, so two runs
deciding at once cannot both take the same rung. Every decision writes an audit event
(``ladder.climbed`` / ``ladder.escalated`` / ``ladder.declined``) linked to the run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from remediator.domain import ladders
from remediator.ports import store

R = TypeVar("R", bound=ladders.Rung | None)


class StoreLadder:
    def __init__(self, store_: store.Store) -> None:
        self.store = store_

    async def _move(
        self,
        key: str,
        move: Callable[[dict[str, Any], dt.datetime], tuple[R, dict[str, Any]]],
        *,
        run_id: int,
        operation: str,
        event: str,
        reason: str | None = None,
        with_previous: bool = False,
    ) -> tuple[R, dict[str, Any]]:
        """Read the ladder, ``move`` it and, when it changed, write it with its audit event
        (``reason``, else the ladder's newest history entry's), in one transaction."""

        def work(tx: store.Tx) -> tuple[R, dict[str, Any]]:
            before = tx.get_guard_state(key)
            rung, after = move(before, tx.now)
            if after != before:
                tx.set_guard_state(key, after)
                value = rung.value if isinstance(rung, ladders.Rung) else None
                data: dict[str, Any] = {"key": key, "rung": value}
                if with_previous:
                    data["previous"] = before.get("rung")
                tx.add_event(
                    event,
                    actor="engine",
                    run_id=run_id,
                    reason=reason if reason is not None else after["history"][-1]["reason"],
                    data=data,
                )
            return rung, after

        return await self.store.run(operation, work)

    async def climb(
        self,
        key: str,
        *,
        run_id: int,
        forget_after: dt.timedelta,
        start: ladders.Rung = ladders.Rung.RESET,
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        return await self._move(
            key,
            lambda before, now: ladders.climb(
                before, run_id=run_id, now=now, forget_after=forget_after, start=start
            ),
            run_id=run_id,
            operation="ladder.climb",
            event="ladder.climbed",
            with_previous=True,
        )

    async def escalate(
        self, key: str, *, run_id: int, to: ladders.Rung, reason: str
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        return await self._move(
            key,
            lambda before, now: ladders.escalate(
                before, run_id=run_id, to=to, now=now, reason=reason
            ),
            run_id=run_id,
            operation="ladder.escalate",
            event="ladder.escalated",
            reason=reason,
        )

    async def decline(
        self, key: str, *, run_id: int, reason: str
    ) -> tuple[ladders.Rung | None, dict[str, Any]]:
        return await self._move(
            key,
            lambda before, now: ladders.decline(before, run_id=run_id, now=now, reason=reason),
            run_id=run_id,
            operation="ladder.decline",
            event="ladder.declined",
            reason=reason,
        )

    async def state(self, key: str) -> dict[str, Any]:
        return await self.store.run("ladder.state", lambda tx: tx.get_guard_state(key))
