"""The store's side of the fleet view: active runs on nodes, unreleased disruptions, held
steps, power caps in place and the breaker, read in one short transaction.

Read at every refresh of a console left open (every 5 s), in a storm too: the steps held in
line for the budget or the breaker are counted on ``ix_steps_waiting`` and read without their
outputs (a 3,000-alert storm's held steps, one light row each); the outputs, which say why
a step is held in the guard's words, are read for the first ``fleet.HELD_SHOWN`` of them and
for the steps holding on their own (a change window, a cooldown: each a node's hold). A kind
of row cut at its limit is named in ``Records.truncated``, never left to pass for the
whole."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.domain import fleet, guards, runs

R = tables.runs
S = tables.steps
D = tables.disruptions
G = tables.guard_state

ACTIVE_RUNS = [status.value for status in runs.RUN_ACTIVE]
CAP_ACTION = "gpu.power_cap"
#: How many rows of each kind the view reads: active runs and held steps well beyond a
#: storm over the largest fleet; disruptions and power caps in place are bounded by the
#: budget and the GPUs.
LIMIT = 50_000
_PENDING = S.c.status == tables.PENDING


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
        async with self.db.read("query.fleet") as conn:
            lines = list(await conn.execute(LINES))
            waiting = list(await conn.execute(_IN_LINE))
            shown = sorted(
                {row.id for row in waiting[: fleet.HELD_SHOWN]} | {row.first for row in lines}
            )
            detailed = list(await conn.execute(_HELD_DETAIL, {"ids": shown})) if shown else []
            detailed += await conn.execute(_HELD_ON_THEIR_OWN)
            found = _Rows(
                runs=list(await conn.execute(_ACTIVE_RUNS)),
                draining={row.run_id for row in await conn.execute(_DRAINING)},
                lines=lines,
                waiting=waiting,
                detailed=detailed,
                disruptions=list(await conn.execute(_DISRUPTIONS)),
                caps=list(await conn.execute(_CAPS)),
                breaker=(await conn.execute(_BREAKER)).scalar_one_or_none(),
            )
        # A storm's thousands of rows become records on a thread: the loop shares the CPU
        # at the interpreter's switch interval instead of waiting it out.
        return await asyncio.to_thread(found.records)


@dataclasses.dataclass(frozen=True)
class _Rows:
    runs: list[Any]
    draining: set[int]
    lines: list[Any]
    waiting: list[Any]
    detailed: list[Any]
    disruptions: list[Any]
    caps: list[Any]
    breaker: Any

    def records(self) -> fleet.Records:
        held = {row.id: step for row in self.detailed if (step := _held(row)) is not None}
        for row in self.waiting:
            if row.id not in held:
                held[row.id] = fleet.HeldStep(
                    run=row.run_id,
                    step=row.key,
                    action=row.action,
                    node=row.node,
                    reason=f"waits in line for {guards.waited_for(row.waiting_for)}",
                    kind=row.waiting_for.partition(":")[0],
                    detailed=False,
                )
        in_line = {row.id for row in self.waiting}
        truncated = [
            kind
            for kind, rows in (
                ("runs", self.runs),
                ("held steps", self.waiting),
                ("disruptions", self.disruptions),
                ("power caps", self.caps),
            )
            if len(rows) >= LIMIT
        ]
        return fleet.Records(
            runs=tuple(
                fleet.ActiveRun(
                    id=row.id,
                    node=row.node,
                    playbook=row.playbook,
                    status=row.status,
                    draining=row.id in self.draining,
                )
                for row in self.runs
            ),
            disruptions=tuple(
                fleet.Disruption(run=row.run_id, node=row.node, pool=row.pool, since=row.started_at)
                for row in self.disruptions
            ),
            held=tuple(held[key] for key in sorted(held)),
            lines=tuple(
                fleet.Line(waiting_for=row.waiting_for, steps=row.steps, first=held[row.first])
                for row in sorted(self.lines, key=lambda row: row.first)
                if row.first in held
            ),
            capped=tuple(gpu for row in self.caps for gpu in _capped(row)),
            breaker=self.breaker if isinstance(self.breaker, dict) else {},
            truncated=tuple(truncated),
            held_total=sum(row.steps for row in self.lines)
            + sum(1 for step_id in held if step_id not in in_line),
        )


def _held(row: Any) -> fleet.HeldStep | None:
    output = row.output if isinstance(row.output, dict) else {}
    if not output.get("held"):
        return None  # pending until a retry's due time, not held
    return fleet.HeldStep(
        run=row.run_id,
        step=row.key,
        action=row.action,
        node=row.node,
        reason=str(output["held"]),
        kind=str(output.get("held_kind") or ""),
        until=output.get("held_until"),
    )


# Each read is told its index on SQLite (``INDEXED BY``, a hint ``tables`` writes out): with
# the statistics of a long history, where every run and step finished, it took each read's
# ``ORDER BY id`` for the cheap way and walked every run or step in id order (four reads,
# 0.5 s a refresh after a million alerts). The conditions name the partial indexes' own
# (written as literals), without which ``INDEXED BY`` fails to prepare.
_CAPS = (
    sa.select(S.c.run_id, S.c.output, R.c.node)
    .with_hint(S, "INDEXED BY ix_steps_action", "sqlite")
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
_DISRUPTIONS = sa.select(D).where(D.c.released_at.is_(None)).order_by(D.c.id).limit(LIMIT)
_BREAKER = sa.select(G.c.value).where(G.c.key == "breaker")
_ACTIVE_RUNS = (
    sa.select(R.c.id, R.c.node, R.c.playbook, R.c.status)
    .with_hint(R, "INDEXED BY ix_runs_status", "sqlite")
    .where(R.c.status.in_(ACTIVE_RUNS), R.c.node.is_not(None))
    .order_by(R.c.id)
    .limit(LIMIT)
)
# Running steps are few (each holds a lease: ``ix_steps_leased``).
_DRAINING = sa.select(S.c.run_id).where(
    S.c.status == sa.literal_column("'running'"), S.c.action.in_(sorted(fleet.DRAINING_ACTIONS))
)
#: Each line of held steps: how many wait in it and the first to go (``ix_steps_waiting``,
#: no table read; the metrics count them with it too).
LINES = (
    sa.select(S.c.waiting_for, sa.func.count().label("steps"), sa.func.min(S.c.id).label("first"))
    .where(tables.STEPS_IN_LINE)
    .group_by(S.c.waiting_for)
)
_IN_LINE = (
    sa.select(S.c.id, S.c.run_id, S.c.key, S.c.action, S.c.waiting_for, R.c.node)
    .with_hint(S, "INDEXED BY ix_steps_waiting", "sqlite")
    .join(R, R.c.id == S.c.run_id)
    .where(tables.STEPS_IN_LINE)
    .order_by(S.c.id)
    .limit(LIMIT)
)
_DETAIL = sa.select(S.c.id, S.c.run_id, S.c.key, S.c.action, S.c.output, R.c.node).join(
    R, R.c.id == S.c.run_id
)
_HELD_DETAIL = _DETAIL.where(S.c.id.in_(sa.bindparam("ids", expanding=True)))
# Held until a due time (a change window, a cooldown, a driver upgrade rechecked), not in a
# line (``ix_steps_due``); the others pending with a due time are due or wait for a retry
# (their outputs say which).
_HELD_ON_THEIR_OWN = (
    _DETAIL.with_hint(S, "INDEXED BY ix_steps_due", "sqlite")
    .where(_PENDING, S.c.due_at.is_not(None), S.c.waiting_for.is_(None))
    .order_by(S.c.id)
    .limit(LIMIT)
)
