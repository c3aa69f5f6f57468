"""``remediator plan``: the plan for an alert payload, computed in this process against the
configured cluster (or the simulator) and, when reachable, the database for guard verdicts."""

from __future__ import annotations

import datetime as dt
import pathlib
from typing import Any

from remediator.adapters import files, kubernetes
from remediator.adapters.db import database, migrate, store
from remediator.adapters.http import responses
from remediator.app import settings as settings_mod
from remediator.domain import alerts, playbooks
from remediator.engine import previewing


def database_exists(settings: settings_mod.Settings) -> bool:
    """A SQLite file that is not there is not created just to plan."""
    url = database.normalise_url(settings.database_url)
    return not url.startswith("sqlite") or pathlib.Path(url.split("///", 1)[-1]).exists()


async def _store(
    settings: settings_mod.Settings,
) -> tuple[database.Database, store.SqlStore] | None:
    url = database.normalise_url(settings.database_url)
    db = database.Database(url, timeout=min(settings.database_timeout, 5))
    try:
        if await migrate.current_revision(db) is None:
            await db.dispose()
            return None
    except Exception:
        await db.dispose()
        return None
    return db, store.SqlStore(db, clock=lambda: dt.datetime.now(dt.UTC))


async def plan_body(
    settings: settings_mod.Settings, body: bytes, *, use_database: bool
) -> dict[str, Any]:
    from remediator.app import build_notifier, build_registry

    payload = alerts.parse_payload(body)
    registry = build_registry(settings.plugins)
    index = playbooks.PlaybookIndex(files.load_playbooks_strict([settings.rules], registry))
    cluster = await kubernetes.connect(settings.kubernetes) if settings.kubernetes else None
    found = await _store(settings) if use_database else None
    notifier = build_notifier(settings)
    try:
        previewer = previewing.Previewer(
            index=index,
            registry=registry,
            notifier=notifier,
            cluster=cluster,
            store=found[1] if found else None,
            guards=settings.guards,
            clock=lambda: dt.datetime.now(dt.UTC),
            dry_run=settings.dry_run,
            node_labels=tuple(settings.target_node_labels),
        )
        planned = await previewer.plan_payload(payload)
    finally:
        await notifier.close()
        if cluster is not None:
            await cluster.close()
        if found is not None:
            await found[0].dispose()
    return {
        "alerts": [responses.alert_plan(alert) for alert in planned],
        "cluster": "connected" if cluster else "not configured (no live state)",
        "guards": "evaluated" if found else "not evaluated (no migrated database)",
    }
