"""The in-memory store's side of alert retention: ``adapters.db.retention`` on ``Tables``."""

from __future__ import annotations

import dataclasses
import datetime as dt

from remediator.adapters.memory import store
from remediator.domain import alerts, records, runs
from remediator.domain import retention as retention_mod


def prune_alert_episodes(tx: store.MemoryTx, *, ended_before: dt.datetime) -> retention_mod.Pruned:
    """Delete expired episodes no run refers to; reduce the rest (see ``domain.retention``)."""
    runs_of: dict[int, list[records.Run]] = {}
    for run in tx.tables.runs.values():
        if run.episode_id is not None:
            runs_of.setdefault(run.episode_id, []).append(run)
    deleted = reduced = 0
    for episode in list(tx.tables.episodes.values()):
        if not _expired(episode, runs_of.get(episode.id, []), ended_before):
            continue
        if episode.id not in runs_of:
            del tx._own("episodes", tx.tables.episodes)[episode.id]
            del tx._own("episode_keys", tx.tables.episode_keys)[
                (episode.fingerprint, episode.starts_at)
            ]
            deleted += 1
        elif episode.first_delivery_id is not None or episode.generator_url:
            tx._own("episodes", tx.tables.episodes)[episode.id] = dataclasses.replace(
                episode,
                labels=retention_mod.reduce_labels(episode.labels),
                annotations={},
                generator_url="",
                first_delivery_id=None,
            )
            reduced += 1
    return retention_mod.Pruned(reduced=reduced, deleted=deleted)


def _expired(
    episode: records.Episode, its_runs: list[records.Run], ended_before: dt.datetime
) -> bool:
    return (
        episode.status is alerts.AlertStatus.RESOLVED
        and episode.handled_status is alerts.AlertStatus.RESOLVED
        and episode.resolved_at is not None
        and episode.resolved_at < ended_before
        and not any(run.status in runs.RUN_ACTIVE for run in its_runs)
    )
