"""The store's side of the fleet view: active runs on nodes, unreleased disruptions, held
steps, power caps in place and the breaker, read in one short transaction."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.domain import fleet, runs

R = tables.runs
S = tables.steps
D = tables.disruptions
G = tables.guard_state

ACTIVE_RUNS = [status.value for status in runs.RUN_ACTIVE]
CAP_ACTION = "gpu.power_cap"
#: How many rows of each kind the view reads (a fleet in a storm is bounded by the budget).
LIMIT = 2000


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _capped(row: Any) -> list[fleet.CappedGpu]:
    output = row.output if isinstance(row.output, dict) else {}
    node = output.get("node") or row.node
    gpus = output.get("gpus")
    if not node or not isinstance(gpus, list):
        return []
    return [
        fleet.CappedGpu(
            node=str(node),
            run=row.run_id,
            uuid=str(gpu.get("uuid", "")),
            limit=_number(gpu.get("verified_limit", gpu.get("set_limit"))),
            previous=_number(gpu.get("previous_limit")),
        )
        for gpu in gpus
        if isinstance(gpu, dict) and gpu.get("changed", True)
    ]


class FleetQueries:
    def __init__(self, db: database.Database) -> None:
        self.db = db

    async def fleet_records(self) -> fleet.Records:
        active_steps = (
            sa.select(S.c.run_id, S.c.key, S.c.action, S.c.status, S.c.output, R.c.node)
            .join(R, R.c.id == S.c.run_id)
            .where(R.c.status.in_(ACTIVE_RUNS), S.c.status.in_(["pending", "running"]))
            .order_by(S.c.id)
            .limit(LIMIT)
        )
        caps = (
            sa.select(S.c.run_id, S.c.output, R.c.node)
            .join(R, R.c.id == S.c.run_id)
            .where(
                S.c.action == CAP_ACTION,
                S.c.phase == runs.StepPhase.DO.value,
                S.c.effect == runs.Effect.APPLIED.value,
                R.c.dry_run.is_(False),
            )
            .order_by(S.c.id)
            .limit(LIMIT)
        )
        async with self.db.read("query.fleet") as conn:
            run_rows = list(
                await conn.execute(
                    sa.select(R.c.id, R.c.node, R.c.playbook, R.c.status)
                    .where(R.c.status.in_(ACTIVE_RUNS), R.c.node.is_not(None))
                    .order_by(R.c.id)
                    .limit(LIMIT)
                )
            )
            step_rows = list(await conn.execute(active_steps))
            disruptions = list(
                await conn.execute(
                    sa.select(D).where(D.c.released_at.is_(None)).order_by(D.c.id).limit(LIMIT)
                )
            )
            cap_rows = list(await conn.execute(caps))
            breaker = (
                await conn.execute(sa.select(G.c.value).where(G.c.key == "breaker"))
            ).scalar_one_or_none()
        draining = {
            row.run_id
            for row in step_rows
            if row.status == "running" and row.action in fleet.DRAINING_ACTIONS
        }
        held = tuple(
            fleet.HeldStep(
                run=row.run_id,
                step=row.key,
                action=row.action,
                node=row.node,
                reason=str(row.output["held"]),
                kind=str(row.output.get("held_kind") or ""),
                until=row.output.get("held_until"),
            )
            for row in step_rows
            if row.status == "pending" and isinstance(row.output, dict) and row.output.get("held")
        )
        return fleet.Records(
            runs=tuple(
                fleet.ActiveRun(
                    id=row.id,
                    node=row.node,
                    playbook=row.playbook,
                    status=row.status,
                    draining=row.id in draining,
                )
                for row in run_rows
            ),
            disruptions=tuple(
                fleet.Disruption(run=row.run_id, node=row.node, pool=row.pool, since=row.started_at)
                for row in disruptions
            ),
            held=held,
            capped=tuple(gpu for row in cap_rows for gpu in _capped(row)),
            breaker=breaker if isinstance(breaker, dict) else {},
        )
