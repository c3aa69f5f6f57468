"""The composition root: builds settings, adapters, engine and the aiohttp app, and owns the
background loops (intake writer, engine, retention). If one loop dies the process stops with a
non-zero exit instead of limping on without it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import importlib
import ipaddress
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from remediator import actions as builtin_actions
from remediator.adapters import (
    alertmanager,
    auditfiles,
    files,
    kubernetes,
    leader,
    metrics,
    notify,
)
from remediator.adapters.db import audit as db_audit
from remediator.adapters.db import database, intake, migrate, queries, retention, store
from remediator.adapters.db import fleet as db_fleet
from remediator.adapters.db import sessions as db_sessions
from remediator.adapters.http import (
    api,
    auth,
    health,
    hygiene,
    openapi,
    operating,
    pages,
    runbooks,
)
from remediator.adapters.http import audit as http_audit
from remediator.adapters.http import errors as http_errors
from remediator.adapters.http import fleet as fleet_http
from remediator.adapters.http import guards as guards_http
from remediator.adapters.http import intake as http_intake
from remediator.adapters.http import plan as plan_http
from remediator.app import logs
from remediator.app import settings as settings_mod
from remediator.domain import audit, errors, playbooks
from remediator.domain import auth as domain_auth
from remediator.engine import (
    approvals,
    executor,
    guarding,
    ladders,
    lifecycle,
    operations,
    reconciler,
    worker,
)
from remediator.ports import actions, cluster
from remediator.ports import leader as leader_port

logger = logging.getLogger("remediator")

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Rules:
    """The loaded playbooks; ``reload`` swaps them atomically (a broken file keeps the old set)."""

    def __init__(self, path: Any, registry: actions.Registry) -> None:
        self.path = path
        self.registry = registry
        self._index = playbooks.PlaybookIndex([])
        self.loaded = False

    @property
    def index(self) -> playbooks.PlaybookIndex:
        return self._index

    def reload(self) -> None:
        loaded = files.load_playbooks_strict([self.path], self.registry)
        self._index = playbooks.PlaybookIndex(loaded)
        self.loaded = True


def build_registry(plugins: list[str]) -> actions.Registry:
    registry = builtin_actions.builtin_registry()
    for name in plugins:
        module = importlib.import_module(name)
        module.register(registry)
    return registry


def build_notifier(settings: settings_mod.Settings) -> notify.WebhookNotifier:
    """The notifier of the configured channels; their secrets are redacted from every log."""
    for channel in settings.notify_channels.values():
        logs.add_secrets(channel.secrets())
    return notify.WebhookNotifier(
        settings.notify_channels,
        routing=settings.notify_routing,
        external_url=str(settings.external_url) if settings.external_url else None,
        on_secrets=logs.add_secrets,
    )


class Components:
    """Everything ``create_app`` builds, reachable from tests through ``app[COMPONENTS]``."""

    def __init__(
        self,
        settings: settings_mod.Settings,
        *,
        clock: Clock,
        registry: actions.Registry,
        cluster: cluster.Cluster | None,
        notifier: Any,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics.Metrics()
        self.db = database.Database(settings.database_url, timeout=settings.database_timeout)
        self.db.latency_observer = self.metrics.observe_db
        self.audit_keys = audit_keys(settings)
        self.store = store.SqlStore(self.db, clock=clock, keys=self.audit_keys)
        self.queries = queries.Queries(self.db)
        self.registry = registry
        self.rules = Rules(settings.rules, registry)
        self.notifier = notifier or build_notifier(settings)
        self.cluster = cluster
        services = executor.Services(
            store=self.store,
            registry=registry,
            notifier=self.notifier,
            cluster=cluster,
            clock=clock,
            observer=self.metrics,
            extra={
                "artifact_dir": settings.artifact_dir,
                "ladder": ladders.StoreLadder(self.store),
                "reboot": settings.reboot,
                "driver_upgrade": settings.driver_upgrade,
                "gpu_exec": settings.gpu_exec,
            },
            silencer=(
                alertmanager.AlertmanagerSilencer(str(settings.alertmanager_url))
                if settings.alertmanager_url
                else None
            ),
        )
        services.extra["budget"] = guarding.StoreBudget(
            self.store,
            base=settings.guards,
            index=lambda: self.rules.index,
            cluster=lambda: services.cluster,  # filled in once connected
        )
        self.services = services
        self.engine = worker.Engine(
            services,
            self.rules,
            worker.EngineSettings(
                poll_interval=settings.poll_interval,
                lease_seconds=settings.lease_seconds,
                max_concurrent_steps=settings.max_concurrent_steps,
                dry_run=settings.dry_run,
                shutdown_grace=settings.shutdown_grace,
                guards=settings.guards,
                guard_channel=settings.guard_channel,
                node_labels=tuple(settings.target_node_labels),
            ),
            owner=settings.worker_id,
        )
        self.reconciler = reconciler.Reconciler(services)
        self.writer = intake.IntakeWriter(
            self.db,
            clock=clock,
            on_change=self.engine.wake,
            on_stored=lambda tally: self.metrics.count_stored(**tally._asdict()),
            keys=self.audit_keys,
        )
        self.audit = db_audit.AuditQueries(
            self.db, keys=self.audit_keys, anchors=settings.audit_anchor_file
        )
        # Singleton loops run only on the leader (``_lifecycle`` builds the elector); the
        # engine's lease sweeper asks the same elector.
        self.singletons: dict[str, leader.Loop] = {"retention": lambda: _retention(self)}
        self.last_anchor_id: int | None = None  # the newest anchor written (None: not read)
        if settings.audit_anchor_file is not None:
            self.singletons["audit-anchor"] = lambda: anchor_forever(self)
        self.elector: leader.Elector | None = None
        self.engine.is_leader = self.is_leader
        entries = files.load_token_entries(settings.tokens) if settings.tokens else None
        self.tokens = domain_auth.TokenBook(entries) if entries is not None else None
        # Exact secret values are redacted from every log line (see ``logs``).
        logs.add_secrets(entry.token for entry in entries or () if entry.token is not None)
        if settings.session_secret is not None:
            logs.add_secrets([settings.session_secret.get_secret_value()])
        self.sessions = db_sessions.SqlSessions(self.db, self.store, clock=clock)

    def build_operations(self) -> operations.Operations:
        """The use cases the HTTP API and the console call."""
        settings = self.settings
        return operations.Operations(
            store=self.store,
            records=db_fleet.FleetQueries(self.db),
            registry=self.registry,
            index=lambda: self.rules.index,
            cluster=lambda: self.cluster,  # connected at start-up
            notifier=self.notifier,
            guards=settings.guards,
            clock=self.clock,
            dry_run=settings.dry_run,
            forbid_alert_sender=settings.approval_forbid_alert_sender,
            node_labels=tuple(settings.target_node_labels),
            wake=self.engine.wake,
            publish=self.engine.publish,
        )

    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader

    def add_singleton(self, name: str, loop: leader.Loop) -> None:
        """Register a loop that only the leader runs (before the app starts)."""
        self.singletons[name] = loop

    async def expire_approvals(self) -> int:
        """Expire approvals older than ``approval_timeout`` with the configured outcome."""
        timeout = self.settings.approval_timeout
        if timeout is None:
            return 0
        older_than = self.clock() - dt.timedelta(seconds=timeout)
        outcome = approvals.ExpiryOutcome(self.settings.approval_expiry_outcome)

        report = lifecycle.Report()

        def work(tx: store.SqlTx) -> int:
            report.finished.clear()
            report.notices.clear()
            return lifecycle.expire_approvals(
                tx,
                older_than=older_than,
                outcome=outcome,
                registry=self.registry,
                report=report,
            )

        expired = await self.store.run("approvals.expire", work)
        await self.engine.publish(report)
        if expired:
            self.engine.wake()
        return expired

    async def reconcile(self) -> reconciler.PassReport:
        """One pass of the reconciler; on-call hears of what it reports."""
        found, report = await self.reconciler.run_once()
        await self.engine.publish(report)
        if any(v.resolution == "undo-planned" for v in found.verdicts):
            self.engine.wake()
        return found


COMPONENTS = web.AppKey("components", Components)
# How the HTTP server runs the app, in ``serve`` and in tests alike. Compressed request bodies
# are refused unread (415), so nothing may inflate them before that: aiohttp's own parser would
# otherwise start inflating a gzip bomb as its bytes arrive, before any middleware runs.
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}
SESSION_SWEEP_INTERVAL = 60.0
SESSION_SWEEP_BATCH = 500
FAILED = web.AppKey("failed", list)
STOPPING = web.AppKey("stopping", list)


def check_exposure(settings: settings_mod.Settings) -> None:
    """Without tokens, refuse to listen anywhere but loopback."""
    if settings.tokens is not None:
        return
    host, _ = settings.host_port
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise SystemExit(
            f"refusing to listen on {host} without a tokens file: set --tokens "
            "(or listen on 127.0.0.1)"
        )


def create_app(
    settings: settings_mod.Settings,
    *,
    clock: Clock = utcnow,
    registry: actions.Registry | None = None,
    cluster: cluster.Cluster | None = None,
    notifier: Any = None,
    run_engine: bool = True,
    migrate_apart: bool = False,
) -> web.Application:
    """The server. ``migrate_apart``: a start-up migration runs in a child process, so the
    server never holds Alembic (``remediator serve``; tests migrate in-process, faster)."""
    components = Components(
        settings,
        clock=clock,
        registry=registry or build_registry(settings.plugins),
        cluster=cluster,
        notifier=notifier,
    )
    components.rules.reload()
    components.metrics.playbooks_loaded.set(len(components.rules.index))
    app = web.Application(
        middlewares=[hygiene.middleware, http_errors.error_middleware, auth.middleware],
        client_max_size=settings.max_body_bytes + 1,
    )
    app[hygiene.LIMITS] = hygiene.Limits(
        body_read_timeout=settings.body_read_timeout,
        max_body_bytes=settings.max_body_bytes,
        external_url=str(settings.external_url) if settings.external_url else None,
    )
    app.on_response_prepare.append(hygiene.name_server)
    app[COMPONENTS] = components
    app[FAILED] = []
    app[STOPPING] = []
    app[http_errors.RETRY_AFTER] = settings.retry_after_seconds
    if components.tokens is not None:
        app[auth.TOKENS] = components.tokens
    app[http_intake.INTAKE] = http_intake.IntakeDeps(
        components.writer, components.metrics, settings.max_body_bytes
    )
    app[operating.OPERATIONS] = components.build_operations()
    app[api.API] = api.ApiDeps(components.queries)
    _web_identity(app, settings, components)
    app[runbooks.RUNBOOKS] = runbooks.RunbookDeps(components.db, components.rules)
    app[http_audit.AUDIT] = http_audit.AuditDeps(components.audit, settings.artifact_dir)
    app[health.HEALTH] = health.HealthDeps(
        components.db, components.rules, components.metrics, clock=components.clock
    )
    app.router.add_post("/api/v1/alerts", http_intake.post_alerts)
    api.add_routes(app)
    plan_http.add_routes(app)
    guards_http.add_routes(app)
    fleet_http.add_routes(app)
    runbooks.add_routes(app)
    http_audit.add_routes(app)
    pages.add_routes(app)
    health.add_routes(app)
    openapi.add_routes(app)
    components.add_singleton("approval-expiry", lambda: expire_approvals_forever(components))
    components.add_singleton("reconciler", lambda: reconcile_forever(components))
    components.add_singleton("sessions", lambda: sweep_sessions_forever(components))
    app.cleanup_ctx.append(_lifecycle(run_engine=run_engine, migrate_apart=migrate_apart))
    return app


def _web_identity(
    app: web.Application, settings: settings_mod.Settings, components: Components
) -> None:
    secret = None
    if settings.session_secret is not None:
        secret = settings.session_secret.get_secret_value().encode()
    app[auth.SESSIONS] = auth.Sessions(
        components.sessions,
        secret,
        ttl=settings.session_ttl,
        secure=settings.cookie_secure,
        clock=components.clock,
    )
    meter = components.metrics
    app[auth.THROTTLE] = auth.Throttle(
        components.sessions,
        limit=settings.auth_failure_limit,
        window=settings.auth_failure_window,
        clock=components.clock,
        on_failure=lambda reason: meter.auth_failures.labels(reason).inc(),
    )
    if settings.trusted_proxies and settings.proxy_user_header:
        app[auth.PROXY] = auth.ProxyTrust(
            tuple(settings.trusted_proxies), settings.proxy_user_header
        )


def _lifecycle(
    *, run_engine: bool, migrate_apart: bool
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle_ctx(app: web.Application) -> AsyncIterator[None]:
        components = app[COMPONENTS]
        if components.settings.should_migrate:
            if migrate_apart:
                await migrate.upgrade_apart(components.db)
            else:
                await migrate.upgrade(components.db)
        if components.cluster is None and components.settings.kubernetes is not None:
            components.cluster = await kubernetes.connect(components.settings.kubernetes)
            components.services.cluster = components.cluster
        elector = components.elector = await _elector(components)
        await elector.step()
        loops = [asyncio.create_task(components.writer.run(), name="intake-writer")]
        if run_engine:
            loops.append(asyncio.create_task(components.engine.run_forever(), name="engine"))
        loops.append(asyncio.create_task(elector.run(), name="leader-election"))
        for task in loops:
            task.add_done_callback(lambda t: _on_loop_done(app, t))
        yield
        app[STOPPING].append(True)
        await components.engine.stop()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await elector.stop()
        if components.cluster is not None:
            await components.cluster.close()
        if isinstance(components.notifier, notify.WebhookNotifier):
            await components.notifier.close()
        if isinstance(components.services.silencer, alertmanager.AlertmanagerSilencer):
            await components.services.silencer.close()
        await components.db.dispose()

    return lifecycle_ctx


def _on_loop_done(app: web.Application, task: asyncio.Task[Any]) -> None:
    if task.cancelled() or app[STOPPING]:
        return
    error = task.exception()
    logger.critical("background loop %s stopped: %r; shutting down", task.get_name(), error)
    app[FAILED].append(task.get_name())
    signal.raise_signal(signal.SIGTERM)


def leader_mode(settings: settings_mod.Settings) -> str:
    """``auto``: a Kubernetes Lease in a cluster, the database on Postgres, else off (SQLite
    serves one replica)."""
    mode = settings.leader_election
    if mode == "kubernetes" and settings.kubernetes is None:
        raise SystemExit("leader_election: kubernetes needs the `kubernetes` setting")
    if mode != "auto":
        return mode
    if settings.kubernetes is not None and settings.kubernetes.resolved_mode() == "incluster":
        return "kubernetes"
    return "off" if settings.is_sqlite else "database"


async def _elector(components: Components) -> leader.Elector:
    settings = components.settings
    mode = leader_mode(settings)
    lease: leader_port.LeaderLease
    if mode == "kubernetes":
        assert settings.kubernetes is not None
        lease = await kubernetes.connect_lease(
            settings.kubernetes,
            name=settings.leader_lease_name,
            namespace=settings.leader_lease_namespace,
        )
    elif mode == "database":
        lease = leader.DatabaseLease(
            components.db, name=settings.leader_lease_name, clock=components.clock
        )
    else:
        lease = leader.Unopposed()
    elector = leader.Elector(
        lease,
        holder=components.engine.owner,
        duration=settings.leader_lease_seconds,
        on_change=components.metrics.set_leader,
    )
    for name, loop in components.singletons.items():
        elector.add_singleton(name, loop)
    return elector


async def _retention(components: Components) -> None:
    while True:
        await retention_pass(components)
        await asyncio.sleep(3600)


async def retention_pass(components: Components) -> None:
    """Expired webhook bodies are deleted, then expired alert episodes reduced or deleted."""
    settings, now = components.settings, components.clock()
    with contextlib.suppress(Exception):
        await retention.delete_old_deliveries(
            components.db, older_than=now - dt.timedelta(days=settings.delivery_retention_days)
        )
    if not settings.alert_retention_days:
        return
    try:
        pruned = await retention.prune_alert_episodes(
            components.db, ended_before=now - dt.timedelta(days=settings.alert_retention_days)
        )
    except Exception:
        logger.exception("alert retention pass failed; trying again in an hour")
        return
    if pruned.reduced or pruned.deleted:
        logger.info(
            "alert retention: %d episodes reduced, %d deleted", pruned.reduced, pruned.deleted
        )


def audit_keys(settings: settings_mod.Settings) -> audit.AuditKeys | None:
    """The audit chain's keys from the settings (``None``: an unkeyed chain)."""
    if settings.audit_key_file is None:
        return None
    try:
        return auditfiles.load_keys(settings.audit_key_file, settings.audit_key_id)
    except audit.AuditKeyError as e:
        raise SystemExit(f"audit_key_file: {e}") from None


async def anchor_once(components: Components) -> audit.Anchor | None:
    """Append the chain head to the anchor file if it moved since the last anchor."""
    path = components.settings.audit_anchor_file
    assert path is not None
    head = await components.audit.head()
    if head is None:
        return None
    if components.last_anchor_id is None:  # once per leadership: the file only grows
        previous = await asyncio.to_thread(auditfiles.read_anchors, path)
        components.last_anchor_id = previous[-1].last_id if previous else 0
    if components.last_anchor_id == head[0]:
        return None
    anchor = audit.Anchor(head[0], head[1], components.clock().isoformat())
    if components.audit_keys is not None:
        anchor = dataclasses.replace(anchor, mac=audit.mac(components.audit_keys, anchor.text()))
    await asyncio.to_thread(auditfiles.append_anchor, path, anchor)
    components.last_anchor_id = anchor.last_id
    return anchor


async def anchor_forever(components: Components) -> None:
    """The leader writes the chain head outside the database every ``audit_anchor_interval``
    seconds, so a writer who rewrites or cuts the chain cannot also rewrite its anchors."""
    components.last_anchor_id = None  # another replica may have led and anchored meanwhile
    while True:
        try:
            await anchor_once(components)
        except errors.RemediatorError as e:
            logger.warning("audit anchor not written: %s", e)
        except Exception:
            logger.exception("audit anchor not written; the next interval tries again")
        await asyncio.sleep(components.settings.audit_anchor_interval)


async def sweep_sessions(components: Components) -> int:
    """End web sessions whose expiry passed (audit ``session.ended``, reason ``expired``) and
    delete them, used nonces that expired and failed sign-ins older than the throttle window."""
    window = dt.timedelta(seconds=components.settings.auth_failure_window)
    return await components.sessions.sweep(
        failures_before=components.clock() - window, limit=SESSION_SWEEP_BATCH
    )


async def sweep_sessions_forever(components: Components) -> None:
    """The leader sweeps sessions every ``SESSION_SWEEP_INTERVAL`` seconds (a full batch
    goes on at once)."""
    while True:
        try:
            swept = await sweep_sessions(components)
        except errors.StoreUnavailable:
            swept = 0
        except Exception:
            logger.exception("session sweep failed; the next pass tries again")
            swept = 0
        if swept < SESSION_SWEEP_BATCH:
            await asyncio.sleep(SESSION_SWEEP_INTERVAL)


async def reconcile_forever(components: Components) -> None:
    """The leader compares the effects ledger with the cluster at once (start-up, or on
    becoming leader) and then every ``reconcile_interval`` seconds."""
    while True:
        try:
            found = await components.reconcile()
        except errors.RemediatorError as e:
            logger.warning("reconciler pass failed: %s", e)
        except Exception:
            logger.exception("reconciler pass crashed; the next pass tries again")
        else:
            if found.verdicts:
                logger.info(
                    "reconciler: %d effects looked at, %d recorded",
                    found.looked_at,
                    len(found.verdicts),
                )
        await asyncio.sleep(components.settings.reconcile_interval)


async def expire_approvals_forever(components: Components) -> None:
    """One singleton loop: expire waiting approvals (safe on several replicas: the expiry is a
    guarded transition, a second replica finds nothing left to expire)."""
    while True:
        try:
            await components.expire_approvals()
        except errors.StoreUnavailable:
            pass
        except Exception:
            logger.exception("approval expiry pass failed; the next pass tries again")
        await asyncio.sleep(components.settings.approval_expiry_interval)
