"""Self-metrics (prometheus-client), one registry per app so tests can run several apps.

Counters and histograms are updated where things happen (intake, engine hooks, database
transactions). Gauges that mirror database state (approvals waiting, breaker, node budget,
runs waiting to start) are read at scrape time by ``read_state``: one cheap query per scrape
instead of updates from every code path, and every replica reports the same values. The
engine-pass metrics are this replica's own (each replica runs its own engine loop);
``/readyz`` reads the same state.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
from typing import Any

import prometheus_client as prom
import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.adapters.db import fleet as db_fleet
from remediator.domain import errors, guards


class Metrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.deliveries = prom.Counter(
            "remediator_deliveries", "Webhook deliveries stored.", registry=r
        )
        self.deliveries_rejected = prom.Counter(
            "remediator_deliveries_rejected",
            "Webhook deliveries refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.alerts_received = prom.Counter(
            "remediator_alerts_received", "Alerts received, by status.", ["status"], registry=r
        )
        self.alerts_deduplicated = prom.Counter(
            "remediator_alerts_deduplicated",
            "Alerts that repeated a stored episode and changed nothing.",
            registry=r,
        )
        self.runs_created_total = prom.Counter(
            "remediator_runs_planned", "Runs created from alerts and triggers.", registry=r
        )
        self.runs = prom.Counter(
            "remediator_runs",
            "Runs finished, by playbook and final state.",
            ["playbook", "state"],
            registry=r,
        )
        self.step_duration = prom.Histogram(
            "remediator_step_duration_seconds",
            "Step attempt duration, by action and outcome.",
            ["action", "outcome"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
            registry=r,
        )
        self.claim_lag_seconds = prom.Histogram(
            "remediator_claim_loop_lag_seconds",
            "Delay between a step becoming due and being claimed.",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.db_latency = prom.Histogram(
            "remediator_db_latency_seconds",
            "Database transaction latency, by operation.",
            ["operation"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
            registry=r,
        )
        self.playbooks_loaded = prom.Gauge(
            "remediator_playbooks_loaded", "Playbooks currently loaded.", registry=r
        )
        self.approvals_pending = prom.Gauge(
            "remediator_approvals_pending", "Steps waiting for an approval.", registry=r
        )
        self.approval_oldest_age = prom.Gauge(
            "remediator_approval_oldest_age_seconds",
            "How long the oldest waiting approval has waited (0 when none waits).",
            registry=r,
        )
        self.breaker_open = prom.Gauge(
            "remediator_breaker_open",
            "1 while the circuit breaker holds disruptive steps, else 0.",
            registry=r,
        )
        self.budget_nodes_in_use = prom.Gauge(
            "remediator_budget_nodes_in_use",
            "Nodes currently disrupted by runs (counted against the disruption budget).",
            registry=r,
        )
        self.leader = prom.Gauge(
            "remediator_leader",
            "1 while this replica runs the singleton loops (leader), else 0.",
            registry=r,
        )
        self.auth_failures = prom.Counter(
            "remediator_auth_failures",
            "Failed sign-ins and API authentications, by reason (unknown_token, malformed, "
            "throttled).",
            ["reason"],
            registry=r,
        )
        self.runs_suppressed = prom.Counter(
            "remediator_runs_suppressed",
            "Alert runs not started at once: suppressed by a cooldown, or waiting for a "
            "concurrency slot.",
            ["reason"],
            registry=r,
        )
        self.engine_quarantined = prom.Counter(
            "remediator_engine_quarantined",
            "Units of engine work taken out after failing repeatedly (an episode that cannot "
            "become runs, a run that cannot start, advance or claim its step).",
            ["unit"],
            registry=r,
        )
        self.orphaned_effects = prom.Counter(
            "remediator_orphaned_effects",
            "Effects the reconciler reported: orphaned (still in the cluster after the alert "
            "resolved, and not undone) or vanished (gone from the cluster although the "
            "playbook keeps them).",
            ["kind"],
            registry=r,
        )
        self.steps_held = prom.Gauge(
            "remediator_steps_held",
            "Steps kept waiting now, by reason: a guard (budget, breaker, change window, node "
            "cooldown) or an approval.",
            ["reason"],
            registry=r,
        )
        self.runs_waiting = prom.Gauge(
            "remediator_runs_waiting",
            "Pending runs that could not start, by what they wait for: a node or a GPU another "
            "run holds, or a free slot of their playbook (its concurrency).",
            ["waiting_for"],
            registry=r,
        )
        self.pass_failures = prom.Counter(
            "remediator_engine_pass_failures",
            "Engine passes that raised, by reason (store_unavailable or error).",
            ["reason"],
            registry=r,
        )
        for reason in PASS_FAILURE_REASONS:
            self.pass_failures.labels(reason=reason)
        self.consecutive_pass_failures = prom.Gauge(
            "remediator_engine_consecutive_pass_failures",
            "Engine passes failed in a row since the last one that completed.",
            registry=r,
        )
        self.last_pass_success = prom.Gauge(
            "remediator_engine_last_success_timestamp_seconds",
            "When an engine pass last completed (Unix time; 0 before the first).",
            registry=r,
        )
        self.failing = FailingPasses()
        self.state_errors = prom.Counter(
            "remediator_metrics_state_errors",
            "Scrapes whose database-state gauges could not be refreshed.",
            registry=r,
        )

    # Observer protocol (engine hooks)
    def run_finished(self, playbook: str, state: str) -> None:
        self.runs.labels(playbook=playbook, state=state).inc()

    def runs_created(self, count: int) -> None:
        self.runs_created_total.inc(count)

    def step_finished(self, action: str, outcome: str, seconds: float) -> None:
        self.step_duration.labels(action=action, outcome=outcome).observe(seconds)

    def claim_lag(self, seconds: float) -> None:
        self.claim_lag_seconds.observe(max(seconds, 0.0))

    def pass_finished(self, *, at: dt.datetime, error: Exception | None = None) -> None:
        if error is None:
            self.failing = FailingPasses()
            self.last_pass_success.set(at.timestamp())
        else:
            unavailable = isinstance(error, errors.StoreUnavailable)
            self.pass_failures.labels(reason=PASS_FAILURE_REASONS[0 if unavailable else 1]).inc()
            self.failing = FailingPasses(
                count=self.failing.count + 1,
                since=self.failing.since or at,
                last_error=type(error).__name__,
            )
        self.consecutive_pass_failures.set(self.failing.count)

    def quarantined(self, unit: str) -> None:
        self.engine_quarantined.labels(unit=unit).inc()

    def effect_reported(self, kind: str) -> None:
        self.orphaned_effects.labels(kind=kind).inc()

    def notice(self, kind: str) -> None:
        if kind in SUPPRESSIONS:
            self.runs_suppressed.labels(reason=SUPPRESSIONS[kind]).inc()

    def count_stored(
        self, *, deliveries: int, firing: int, resolved: int, deduplicated: int
    ) -> None:
        """A committed intake batch: its deliveries, their alerts by status, and those of them
        that changed nothing."""
        self.deliveries.inc(deliveries)
        self.alerts_received.labels("firing").inc(firing)
        self.alerts_received.labels("resolved").inc(resolved)
        self.alerts_deduplicated.inc(deduplicated)

    def observe_db(self, operation: str, seconds: float) -> None:
        self.db_latency.labels(operation=operation).observe(seconds)

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def set_state(self, state: State) -> None:
        self.approvals_pending.set(state.approvals_pending)
        self.approval_oldest_age.set(state.approval_oldest_age)
        self.breaker_open.set(1 if state.breaker_open else 0)
        self.budget_nodes_in_use.set(state.budget_nodes_in_use)
        held = {"approval": state.approvals_pending} | dict(state.held)
        for reason in HELD_REASONS:
            self.steps_held.labels(reason=reason).set(held.get(reason, 0))
        waiting = dict(state.waiting)
        for kind in WAITING_FOR.values():
            self.runs_waiting.labels(waiting_for=kind).set(waiting.get(kind, 0))

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)


#: Notice kinds that count as suppressed runs, and the metric's reason for each.
SUPPRESSIONS = {"suppressed": "cooldown", "waiting": "concurrency"}
HELD_REASONS = ("approval", *guards.HOLD_KINDS)
#: What a parked run waits for (``runs.waiting_for``), by the start of its key.
WAITING_FOR = {"node": "node", "gpu:": "gpu", "slot": "slot"}


PASS_FAILURE_REASONS = ("store_unavailable", "error")


@dataclasses.dataclass(frozen=True)
class FailingPasses:
    """The engine passes that failed since the last one that completed (readiness reads it)."""

    count: int = 0
    since: dt.datetime | None = None  # when the first of them ended
    last_error: str = ""  # the exception's type: no message, /readyz is unauthenticated


@dataclasses.dataclass(frozen=True)
class State:
    approvals_pending: int = 0
    approval_oldest_age: float = 0.0
    breaker_open: bool = False
    budget_nodes_in_use: int = 0
    held: tuple[tuple[str, int], ...] = ()
    waiting: tuple[tuple[str, int], ...] = ()


_S = tables.steps
_PENDING_STEP = _S.c.status == tables.PENDING
# Steps waiting in line for the budget or the breaker are counted by line (``db_fleet.LINES``:
# a storm's thousands, read as a few counts); the other held steps' outputs say what holds
# them (few: each a node's own hold).
_HELD = sa.select(_S.c.output).where(
    _PENDING_STEP,
    _S.c.due_at > sa.bindparam("now", type_=tables.UTCDateTime()),
    _S.c.waiting_for.is_(None),
)


_R = tables.runs
_KIND = sa.func.substr(_R.c.waiting_for, 1, 4)
# Parked runs, read on the index of what they wait for (``ix_runs_waiting``).
_WAITING = (
    sa.select(_KIND.label("kind"), sa.func.count().label("runs"))
    .where(_R.c.status == tables.PENDING, _R.c.waiting_for.is_not(None))
    .group_by(_KIND)
)


async def _held(conn: Any, now: dt.datetime) -> tuple[tuple[str, int], ...]:
    """Steps a guard holds now, by the guard (``budget:<pool>`` counts as ``budget``). A
    storm held by its budget is a few grouped counts: the output of each of its 3,000 held
    steps was read and parsed at every scrape. The rest are a bounded read."""
    counts: collections.Counter[str] = collections.Counter()
    for row in await conn.execute(db_fleet.LINES):
        counts[row.waiting_for.partition(":")[0]] += row.steps
    for row in await conn.execute(_HELD.limit(10_000), {"now": now}):
        kind = (row.output or {}).get("held_kind")
        if kind:
            counts[kind] += 1
    return tuple(sorted(counts.items()))


def _state_query() -> sa.Select[Any]:
    steps, runs_t = tables.steps, tables.runs
    waiting = tables.STEP_WAITING_APPROVAL  # (every step ever stored read otherwise)
    pending = (
        sa.select(sa.func.count()).select_from(steps).where(steps.c.status == waiting)
    ).scalar_subquery()
    oldest = (
        sa.select(sa.func.min(runs_t.c.updated_at))
        .select_from(runs_t.join(steps, steps.c.run_id == runs_t.c.id))
        .where(runs_t.c.status == waiting, steps.c.status == waiting)
    ).scalar_subquery()
    breaker = (
        sa.select(tables.guard_state.c.value).where(tables.guard_state.c.key == "breaker")
    ).scalar_subquery()
    d = tables.disruptions
    in_use = (
        sa.select(sa.func.count(sa.distinct(d.c.node))).where(d.c.released_at.is_(None))
    ).scalar_subquery()
    return sa.select(
        pending.label("pending"),
        sa.type_coerce(oldest, tables.UTCDateTime()).label("oldest"),
        sa.type_coerce(breaker, tables.JSONType).label("breaker"),
        in_use.label("in_use"),
    )


async def read_state(db: database.Database, *, now: dt.datetime) -> State:
    """The database-state gauges in one read (absent breaker row: closed; no rows: zero)."""
    async with db.read("metrics") as conn:
        row = (await conn.execute(_state_query())).one()
        held = await _held(conn, now)
        waiting = (await conn.execute(_WAITING)).all()
    oldest = row.oldest
    breaker = row.breaker if isinstance(row.breaker, dict) else {}
    return State(
        approvals_pending=int(row.pending or 0),
        approval_oldest_age=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        breaker_open=bool(breaker.get("open", False)),
        budget_nodes_in_use=int(row.in_use or 0),
        held=held,
        waiting=tuple(
            sorted((WAITING_FOR[row.kind], row.runs) for row in waiting if row.kind in WAITING_FOR)
        ),
    )
