"""The schema, as SQLAlchemy Core tables. Alembic migrations create it; a test checks they agree.

Uniqueness carries idempotency, not memory:
- ``alert_episodes (fingerprint, starts_at)``: one row per episode, whatever the repeats;
- ``runs (episode_id, playbook, kind)``: at most one run per matching playbook and episode;
- ``steps (run_id, phase, key)``: one intent per step;
- ``locks (key)``: node exclusivity, playbook concurrency slots and cooldowns, race-free across
  replicas because the database refuses the second insert.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles


class UTCDateTime(sa.types.TypeDecorator[dt.datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out, on SQLite (text) and Postgres alike."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        """On SQLite, ``process_bind_param`` then the DATETIME text SQLAlchemy writes
        (``YYYY-MM-DD HH:MM:SS.ffffff``, the microseconds always written: text that sorts
        and compares as the times do), in one function: a datetime bound is several a row
        held or inserted, and SQLAlchemy's DATETIME processor (a dict of its fields
        formatted) took as long again."""
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)
        param = self.process_bind_param

        def process(value: dt.datetime | None) -> str | None:
            naive = param(value, dialect)
            return None if naive is None else naive.isoformat(" ", "microseconds")

        return process

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BigID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

deliveries = sa.Table(
    "deliveries",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("received_at", UTCDateTime(), nullable=False, index=True),
    sa.Column("receiver", sa.Text(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("group_key", sa.Text(), nullable=False),
    sa.Column("alert_count", sa.Integer(), nullable=False),
    sa.Column("principal", sa.String(200), nullable=True),
    sa.Column("remote", sa.String(200), nullable=True),
    sa.Column("body", sa.Text(), nullable=False),
    # ``key_id:hex`` HMAC of the row with the audit key (migration 0006); NULL without a key.
    sa.Column("mac", sa.String(140), nullable=True),
)


def _partial_index(name: str, *columns: str, where: str) -> sa.Index:
    """An index of the rows meeting ``where`` (both backends take the same SQL)."""
    return sa.Index(name, *columns, sqlite_where=sa.text(where), postgresql_where=sa.text(where))


alert_episodes = sa.Table(
    "alert_episodes",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("starts_at", UTCDateTime(), nullable=False),
    sa.Column("alertname", sa.String(256), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("handled_status", sa.String(16), nullable=True),
    sa.Column("labels", JSONType, nullable=False),
    sa.Column("annotations", JSONType, nullable=False),
    sa.Column("generator_url", sa.Text(), nullable=False),
    sa.Column("ends_at", UTCDateTime(), nullable=True),
    sa.Column("first_delivery_id", BigID, nullable=True),
    sa.Column("resolved_delivery_id", BigID, nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("resolved_at", UTCDateTime(), nullable=True),
    sa.UniqueConstraint("fingerprint", "starts_at", name="uq_alert_episodes_identity"),
    sa.Index("ix_alert_episodes_alertname_created", "alertname", "created_at"),
    _partial_index(
        "ix_alert_episodes_unhandled",
        "id",
        where="handled_status IS NULL OR handled_status <> status",
    ),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("playbook", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("episode_id", BigID, sa.ForeignKey("alert_episodes.id"), nullable=True),
    sa.Column("parent_run_id", BigID, sa.ForeignKey("runs.id"), nullable=True),
    sa.Column("node", sa.String(253), nullable=True),
    sa.Column("gpu", sa.String(128), nullable=True),
    sa.Column("exclusive", sa.Boolean(), nullable=False),
    sa.Column("dry_run", sa.Boolean(), nullable=False),
    sa.Column("principal", sa.String(200), nullable=True),
    sa.Column("params", JSONType, nullable=False),
    sa.Column("on_resolve", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    # What a pending run that could not start waits for: a lock key (``node:…``, ``gpu:…``)
    # or a playbook's slot prefix (``slot:<playbook>:``). The engine does not look at it again
    # until that is released (migration 0011). Bookkeeping, not audited (``audit.VOLATILE``).
    sa.Column("waiting_for", sa.String(400), nullable=True),
    sa.UniqueConstraint("episode_id", "playbook", "kind", name="uq_runs_episode_playbook"),
    sa.Index("ix_runs_status", "status", "id"),
    sa.Index("ix_runs_node", "node", "created_at"),
    sa.Index("ix_runs_playbook", "playbook", "created_at"),
    # The unfinished runs in id order: the engine's "a pending (running) run?" and its claims
    # read them here whatever the statistics say (migration 0009). On the status index
    # Postgres chose by its statistics, and in ones taken during a storm (most runs running)
    # it scanned every run stored once the storm was over, in every probe.
    _partial_index(
        "ix_runs_active", "id", where="status IN ('pending', 'running', 'waiting_approval')"
    ),
    # The pending runs to try to start: those waiting for nothing. The engine's "a run to
    # start?" and its start stage read them here, never the runs parked behind a held node or
    # a full playbook: with 10,000 of those the walk took 6 ms (SQLite) to 53 ms (Postgres)
    # before every pass (migration 0011).
    _partial_index("ix_runs_startable", "id", where="status = 'pending' AND waiting_for IS NULL"),
    # The parked runs by what they wait for, oldest first: a release wakes those waiting for
    # its keys (for a slot, the oldest waiting for one of its playbook).
    _partial_index(
        "ix_runs_waiting",
        "waiting_for",
        "id",
        where="status = 'pending' AND waiting_for IS NOT NULL",
    ),
    # A run's undo runs (the reconciler, for every effect it looks at; a run's page): without
    # it each read scanned every run stored, 55 ms with 10⁶ (migration 0009).
    _partial_index("ix_runs_parent", "parent_run_id", "id", where="parent_run_id IS NOT NULL"),
)

steps = sa.Table(
    "steps",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("run_id", BigID, sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("key", sa.String(64), nullable=False),
    sa.Column("phase", sa.String(8), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("params", JSONType, nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("requires_approval", sa.Boolean(), nullable=False),
    sa.Column("approvals_required", sa.Integer(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("timeout_seconds", sa.Float(), nullable=False),
    sa.Column("on_failure", sa.String(16), nullable=False),
    sa.Column("undo_of", BigID, sa.ForeignKey("steps.id"), nullable=True),
    sa.Column("undo", JSONType, nullable=True),
    sa.Column("retry", JSONType, nullable=False),
    sa.Column("effect", sa.String(16), nullable=False, server_default="none"),
    sa.Column("due_at", UTCDateTime(), nullable=True),
    sa.Column("lease_owner", sa.String(128), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
    sa.Column("output", JSONType, nullable=False),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("waiting_for", sa.String(400), nullable=True),
    sa.UniqueConstraint("run_id", "phase", "key", name="uq_steps_intent"),
    _partial_index("ix_steps_due", "due_at", where="status = 'pending' AND due_at IS NOT NULL"),
    _partial_index("ix_steps_leased", "lease_expires_at", where="status = 'running'"),
    # The steps a guard holds by what they wait for, oldest first: a node leaving the budget
    # wakes the oldest held for its budget, a breaker reset those held by the breaker
    # (migration 0012).
    _partial_index(
        "ix_steps_waiting",
        "waiting_for",
        "id",
        where="status = 'pending' AND waiting_for IS NOT NULL",
    ),
    # The steps waiting for approval, oldest first: counted at every scrape of the metrics,
    # listed at every refresh of the console (a scan of every step ever stored, 2,000,000
    # after a million alerts: 0.2 s each; migration 0013).
    _partial_index("ix_steps_waiting_approval", "id", where="status = 'waiting_approval'"),
)
#: The pending status of a run or step, written into a statement rather than bound: the
#: partial indexes on pending rows serve only a condition that names it (and ``INDEXED BY``
#: one that cannot be used fails to prepare).
PENDING = sa.literal_column("'pending'", sa.String())
#: Steps held in line for what wakes them (``guards.wait_key``), as ``ix_steps_waiting`` holds
#: them.
STEPS_IN_LINE = sa.and_(steps.c.status == PENDING, steps.c.waiting_for.is_not(None))
#: A step's status compared with this literal, not a parameter, is read on
#: ``ix_steps_waiting_approval`` by Postgres too: a prepared statement's generic plan cannot
#: tell a parameter's value implies the partial index's condition (SQLite looks at the bound
#: value).
STEP_WAITING_APPROVAL = sa.literal_column("'waiting_approval'", sa.String())

locks = sa.Table(
    "locks",
    metadata,
    sa.Column("key", sa.String(400), primary_key=True),
    sa.Column("run_id", BigID, sa.ForeignKey("runs.id"), nullable=True),
    sa.Column("acquired_at", UTCDateTime(), nullable=False),
    sa.Column("expires_at", UTCDateTime(), nullable=True),
    sa.Index("ix_locks_run", "run_id"),
)

# Runs that may have a next step to decide: a step of theirs stopped being active (finished,
# or stopped running), or they started. The engine's "a run to advance?" reads these (and the
# runs of resolutions not yet handled) instead of every running run, so its cost follows what
# changed, not how many runs are under way: with 10,000 runs each waiting on a running or due
# step it walked them all, 10-19 ms a probe, before every pass (migration 0010). A hint may
# outlive its reason (the run moved on in a later transaction): the engine checks the run and
# deletes it. Written by the transaction that made the change, when it commits (and by the
# leader's once-a-minute look for a run to advance that no hint names).
advance_hints = sa.Table(
    "advance_hints",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("run_id", BigID, sa.ForeignKey("runs.id"), nullable=False),
)

approvals = sa.Table(
    "approvals",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("step_id", BigID, sa.ForeignKey("steps.id"), nullable=False),
    sa.Column("principal", sa.String(200), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("comment", sa.Text(), nullable=False),
    sa.Column("at", UTCDateTime(), nullable=False),
    sa.UniqueConstraint("step_id", "principal", name="uq_approvals_step_principal"),
)

audit_events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("at", UTCDateTime(), nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
    sa.Column("run_id", BigID, nullable=True),
    sa.Column("step_id", BigID, nullable=True),
    sa.Column("episode_id", BigID, nullable=True),
    sa.Column("from_status", sa.String(24), nullable=True),
    sa.Column("to_status", sa.String(24), nullable=True),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("data", JSONType, nullable=False),
    sa.Column("prev_hash", sa.String(64), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    # Keyed chain (migration 0006): the key that signed the event (NULL: plain sha256) and the
    # digests of the runs, steps and approvals rows its transaction wrote.
    sa.Column("key_id", sa.String(64), nullable=True),
    sa.Column("rows", JSONType, nullable=True),
    sa.Index("ix_audit_events_run", "run_id", "id"),
    sa.Index("ix_audit_events_at", "at"),
)

# One row: the head of the audit hash chain. Writers lock it (Postgres ``FOR UPDATE``) so the
# chain stays linear with several replicas.
audit_head = sa.Table(
    "audit_head",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("last_id", BigID, nullable=True),
    sa.Column("last_hash", sa.String(64), nullable=False),
)

# Fleet safety guards. ``disruptions`` holds one row per node a run disrupts (cordon, drain,
# taint, evict): rows without ``released_at`` are the budget in use; rows started within the
# breaker window count towards tripping it. ``guard_state`` keeps the breaker (open/closed, who
# reset it) so it holds across restarts and replicas.
disruptions = sa.Table(
    "disruptions",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("run_id", BigID, sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("pool", sa.String(253), nullable=True),
    sa.Column("started_at", UTCDateTime(), nullable=False),
    sa.Column("released_at", UTCDateTime(), nullable=True),
    sa.UniqueConstraint("run_id", "node", name="uq_disruptions_run_node"),
    sa.Index("ix_disruptions_started", "started_at"),
    # A node's last disruption, read by every guard decision (the per-node cooldown): without
    # it that read scanned the whole history (migration 0008).
    sa.Index("ix_disruptions_node", "node", "started_at"),
    _partial_index("ix_disruptions_active", "node", where="released_at IS NULL"),
)

guard_state = sa.Table(
    "guard_state",
    metadata,
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("value", JSONType, nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
)

# Leader leases for singleton loops when no Kubernetes Lease is available.
leader_leases = sa.Table(
    "leader_leases",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("holder", sa.String(200), nullable=False),
    sa.Column("acquired_at", UTCDateTime(), nullable=False),
    sa.Column("renewed_at", UTCDateTime(), nullable=False),
    sa.Column("expires_at", UTCDateTime(), nullable=False),
)

# Auditor queries (migration 0003): filters answer from an index, newest first.
AUDIT_INDEXES = (
    sa.Index("ix_audit_events_actor", audit_events.c.actor, audit_events.c.id),
    sa.Index("ix_audit_events_kind", audit_events.c.kind, audit_events.c.id),
    sa.Index("ix_audit_events_to_status", audit_events.c.to_status, audit_events.c.id),
    sa.Index("ix_audit_events_step", audit_events.c.step_id),
    sa.Index("ix_audit_events_episode", audit_events.c.episode_id),
    sa.Index("ix_runs_gpu", runs.c.gpu, runs.c.created_at),
    sa.Index("ix_runs_principal", runs.c.principal, runs.c.created_at),
    sa.Index("ix_runs_created", runs.c.created_at),
    sa.Index("ix_steps_action", steps.c.action, steps.c.run_id),
    sa.Index("ix_approvals_principal", approvals.c.principal),
)

# Runs a principal acted on (migration 0004): the audit filter's subquery reads only the index.
PRINCIPAL_INDEXES = (
    sa.Index("ix_audit_events_actor_run", audit_events.c.actor, audit_events.c.run_id),
)

# Web sessions shared by every replica (migration 0007). A session is known by the SHA-256 of
# its cookie's random id (the id itself is never stored); a row lives until its expiry, and the
# sweeper ends it then (audit event ``session.ended``, reason ``expired``) and deletes it.
web_sessions = sa.Table(
    "web_sessions",
    metadata,
    sa.Column("id_sha256", sa.String(64), primary_key=True),
    sa.Column("principal", sa.String(200), nullable=False),
    sa.Column("remote", sa.String(200), nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("expires_at", UTCDateTime(), nullable=False),
    sa.Column("revoked_at", UTCDateTime(), nullable=True),
    sa.Column("end_reason", sa.String(16), nullable=True),
    sa.Index("ix_web_sessions_expires", "expires_at"),
)

# Sign-in nonces already posted (SHA-256 of the nonce), kept until the nonce expires.
login_nonces = sa.Table(
    "login_nonces",
    metadata,
    sa.Column("nonce_sha256", sa.String(64), primary_key=True),
    sa.Column("expires_at", UTCDateTime(), nullable=False),
    sa.Index("ix_login_nonces_expires", "expires_at"),
)

# One row per failed sign-in and throttle key (``address=…``, ``name=…``); rows older than
# the throttle window are deleted by the sweeper.
auth_failures = sa.Table(
    "auth_failures",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(200), nullable=False),
    sa.Column("at", UTCDateTime(), nullable=False),
    sa.Index("ix_auth_failures_key_at", "key", "at"),
    sa.Index("ix_auth_failures_at", "at"),
)


@compiles(sa.Table, "sqlite")
def _table_sqlite(table: sa.Table, compiler: Any, **kw: Any) -> str:
    """A table as SQLite names it, with a statement's hint for it (``Select.with_hint(table,
    "INDEXED BY ...", "sqlite")``) after it in a FROM clause: SQLAlchemy's SQLite compiler
    drops such hints."""
    text = str(compiler.visit_table(table, **kw))
    hints = kw.get("fromhints")
    if kw.get("asfrom") and hints and table in hints:
        text += f" {hints[table]}"
    return text
