"""Alertmanager silences while a disruptive run is active (playbook ``silence:``).

When a run's first disruptive step is claimed, the node's follow-up alerts are silenced (the
matchers take the listed labels' values from the run's alert), so a drain does not page anyone
for the alerts it causes. The silence id is kept in ``guard_state`` (``silence:run:<id>``), so
any replica expires it when the run ends. Failures to talk to Alertmanager are logged and
recorded, never fatal to the run.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from remediator.domain import errors, playbooks, runs
from remediator.ports import silences, store

logger = logging.getLogger("remediator.engine")

PREFIX = "silence:run:"


async def start(
    silencer: silences.Silencer,
    store_: store.Store,
    index: playbooks.PlaybookIndex,
    run_id: int,
) -> None:
    def load(tx: store.Tx) -> tuple[Any, dict[str, str], dict[str, Any]] | None:
        run = tx.get_run(run_id)
        if run is None or run.episode_id is None:
            return None
        episode = tx.get_episode(run.episode_id)
        return run, episode.labels if episode else {}, tx.get_guard_state(f"{PREFIX}{run_id}")

    found = await store_.run("silence.load", load)
    if found is None:
        return
    run, labels, existing = found
    playbook = index.get(run.playbook)
    if existing or playbook is None or playbook.silence is None:
        return
    matchers = {name: labels[name] for name in playbook.silence.labels if labels.get(name)}
    if not matchers:
        return
    now = dt.datetime.now(dt.UTC)
    try:
        silence_id = await silencer.create(
            matchers=matchers,
            starts_at=now,
            ends_at=now + playbook.silence.duration,
            comment=f"remediator run {run_id} ({run.playbook}) is remediating {run.node}",
        )
    except errors.RemediatorError as e:
        logger.error("could not silence alerts for run %s: %s", run_id, e)
        return

    def record(tx: store.Tx) -> None:
        tx.set_guard_state(f"{PREFIX}{run_id}", {"id": silence_id, "matchers": matchers})
        tx.add_event(
            "silence.created",
            actor="engine",
            run_id=run_id,
            reason=f"silenced {matchers} in Alertmanager",
            data={"silence_id": silence_id, "matchers": matchers},
        )

    await store_.run("silence.record", record)


async def finish_ended(silencer: silences.Silencer, store_: store.Store) -> None:
    """Expire the silences of runs that have ended."""

    def ended(tx: store.Tx) -> list[tuple[str, int, str]]:
        done = []
        for key, value in tx.guard_states(PREFIX).items():
            run_id = int(key[len(PREFIX) :])
            run = tx.get_run(run_id)
            if run is None or run.status in runs.RUN_TERMINAL:
                done.append((key, run_id, str(value.get("id"))))
        return done

    for key, run_id, silence_id in await store_.run("silence.scan", ended):
        try:
            await silencer.expire(silence_id)
        except errors.RemediatorError as e:
            logger.error("could not expire silence %s of run %s: %s", silence_id, run_id, e)
            continue

        def forget(
            tx: store.Tx, key: str = key, run_id: int = run_id, sid: str = silence_id
        ) -> None:
            tx.delete_guard_state(key)
            tx.add_event(
                "silence.expired",
                actor="engine",
                run_id=run_id,
                reason="run ended",
                data={"silence_id": sid},
            )

        await store_.run("silence.forget", forget)
