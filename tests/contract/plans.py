"""Small runs, alerts and calls the contract tests build on (the same for every backend)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from remediator.domain import playbooks, records, runs, transitions
from tests.contract.conftest import Backend
from tests.support.alerts import alert_body

T = TypeVar("T")
NODE = "gpu-node-03"


def new_run(
    *,
    episode_id: int | None = None,
    playbook: str = "reboot",
    kind: runs.RunKind = runs.RunKind.ALERT,
    node: str | None = NODE,
    exclusive: bool = True,
    on_resolve: playbooks.ResolvePolicy = playbooks.ResolvePolicy.CANCEL,
    status: runs.RunStatus = runs.RunStatus.PENDING,
    steps: tuple[str, ...] = ("first", "second"),
    disabled: tuple[str, ...] = (),
    dry_run: bool = False,
) -> records.NewRun:
    return records.NewRun(
        playbook=playbook,
        kind=kind,
        episode_id=episode_id,
        node=node,
        gpu=None,
        exclusive=exclusive,
        dry_run=dry_run,
        on_resolve=on_resolve,
        reason="test",
        status=status,
        steps=tuple(
            records.NewStep(
                seq=seq,
                key=key,
                phase=runs.StepPhase.DO,
                action="test.record",
                params={"label": key},
                enabled=key not in disabled,
            )
            for seq, key in enumerate(steps)
        ),
    )


async def run(backend: Backend, work: Callable[[Any], T]) -> T:
    result: T = await backend.store.run("test", work)
    return result


async def fire(
    backend: Backend, *, node: str = NODE, status: str = "firing", fingerprint: str = "f0"
) -> records.Episode:
    """Deliver one alert for ``node`` and return its episode as it is stored now."""
    await backend.receive(alert_body(node=node, status=status, fingerprint=fingerprint))

    def find(tx: Any) -> records.Episode:
        # Ids may have gaps (a Postgres upsert takes a sequence value even when it conflicts).
        for episode_id in range(1, 200):
            episode = tx.get_episode(episode_id)
            if episode is not None and episode.fingerprint == fingerprint:
                return episode
        raise AssertionError(f"no episode {fingerprint}")

    return await run(backend, find)


async def alert_run(backend: Backend, **kwargs: Any) -> tuple[records.Episode, int]:
    """A firing episode and a pending alert run of it."""
    episode = await fire(backend)
    run_id = await run(
        backend,
        lambda tx: tx.insert_run(new_run(episode_id=episode.id, **kwargs), actor="engine"),
    )
    return episode, run_id


async def started_run(backend: Backend, **kwargs: Any) -> tuple[records.Episode, records.Run]:
    """An alert run moved to ``running``."""
    episode, run_id = await alert_run(backend, **kwargs)

    def start(tx: Any) -> records.Run:
        current = tx.get_run(run_id)
        return tx.apply(transitions.move_run(current, runs.RunStatus.RUNNING, reason="go"))

    return episode, await run(backend, start)


async def due_step(backend: Backend, **kwargs: Any) -> records.Step:
    """The first step of a running alert run, made due now."""
    _, current = await started_run(backend, **kwargs)

    def make_due(tx: Any) -> records.Step:
        first = tx.steps_of_run(current.id)[0]
        return tx.apply(transitions.make_due(first, now=tx.now))

    return await run(backend, make_due)


async def claimed_step(
    backend: Backend, *, owner: str = "w1", lease_seconds: float = 30.0, **kwargs: Any
) -> records.Step:
    step = await due_step(backend, **kwargs)

    def claim(tx: Any) -> records.Step:
        until = tx.now + dt.timedelta(seconds=lease_seconds)
        return tx.apply(transitions.claim(step, owner=owner, lease_until=until, now=tx.now))

    return await run(backend, claim)
