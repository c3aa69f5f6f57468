"""Alert retention: episodes that ended long ago keep only what the audit trail needs, or go
when no run refers to them; runs and the audit log are kept, live episodes are untouched."""

from __future__ import annotations

import dataclasses
import datetime as dt

from remediator.domain import alerts, runs
from tests.contract.plans import NODE, new_run, run
from tests.support.alerts import alert_body

DAY = 86400
RETENTION = dt.timedelta(days=90)
PRIVATE = {"namespace": "team-a", "pod": "train-llm-7f9c", "UUID": "GPU-1", "job": "dcgm"}


async def _episode(backend, fingerprint, *, status="resolved", handled=True, node=NODE):
    """An episode of ``fingerprint``, fired and (by default) resolved and handled."""
    await backend.receive(
        alert_body(node=node, fingerprint=fingerprint, extra_labels={**PRIVATE, "node": node})
    )
    if status == "resolved":
        await backend.receive(alert_body(node=node, fingerprint=fingerprint, status="resolved"))

    def find_and_handle(tx):
        for episode_id in range(1, 200):
            episode = tx.get_episode(episode_id)
            if episode is not None and episode.fingerprint == fingerprint:
                if handled:
                    tx.mark_episode_handled(episode)
                return episode.id
        raise AssertionError(fingerprint)

    return await run(backend, find_and_handle)


async def _with_run(backend, episode_id, status):
    return await run(
        backend,
        lambda tx: tx.insert_run(
            new_run(episode_id=episode_id, status=status, node=None, exclusive=False),
            actor="test",
        ),
    )


async def _get(backend, episode_id):
    return await run(backend, lambda tx: tx.get_episode(episode_id))


async def _prune(backend, batch=1000):
    return await backend.prune_alerts(ended_before=backend.clock.now - RETENTION, batch=batch)


async def test_an_expired_episode_with_finished_runs_keeps_only_what_the_audit_needs(backend):
    episode_id = await _episode(backend, "f0")
    run_id = await _with_run(backend, episode_id, runs.RunStatus.FAILED)
    events = await backend.events()
    backend.clock.advance(91 * DAY)

    pruned = await _prune(backend)

    assert (pruned.reduced, pruned.deleted) == (1, 0)
    episode = await _get(backend, episode_id)
    assert episode.labels == {
        "alertname": "GPUXidError79",
        "node": NODE,
        "severity": "critical",
        "UUID": "GPU-1",
    }
    assert (episode.annotations, episode.generator_url) == ({}, "")
    assert episode.first_delivery_id is None
    assert (episode.fingerprint, episode.alertname) == ("f0", "GPUXidError79")
    assert episode.status is alerts.AlertStatus.RESOLVED
    kept_run = await run(backend, lambda tx: tx.get_run(run_id))
    assert (kept_run.episode_id, kept_run.status) == (episode_id, runs.RunStatus.FAILED)
    assert await backend.events() == events
    assert await backend.chain_ok()
    assert dataclasses.astuple(await _prune(backend)) == (0, 0)  # reduced once


async def test_an_expired_episode_no_run_refers_to_is_deleted(backend):
    old = await _episode(backend, "f-old")
    backend.clock.advance(60 * DAY)
    recent = await _episode(backend, "f-recent", node="gpu-node-04")
    backend.clock.advance(31 * DAY)

    pruned = await _prune(backend)

    assert (pruned.reduced, pruned.deleted) == (0, 1)
    assert await _get(backend, old) is None
    kept = await _get(backend, recent)
    assert kept.labels["pod"] == "train-llm-7f9c"
    assert kept.annotations != {}


async def test_live_unhandled_and_running_episodes_are_kept_whole(backend):
    firing = await _episode(backend, "f-firing", status="firing", node="gpu-node-01")
    unhandled = await _episode(backend, "f-unhandled", handled=False, node="gpu-node-02")
    active = await _episode(backend, "f-active", node="gpu-node-04")
    await _with_run(backend, firing, runs.RunStatus.FAILED)
    await _with_run(backend, active, runs.RunStatus.PENDING)
    before = [await _get(backend, episode_id) for episode_id in (firing, unhandled, active)]
    backend.clock.advance(365 * DAY)

    assert dataclasses.astuple(await _prune(backend)) == (0, 0)
    assert [await _get(backend, e) for e in (firing, unhandled, active)] == before


async def test_a_pass_works_through_every_batch(backend):
    ids = [await _episode(backend, f"f{n}", node=f"gpu-node-1{n}") for n in range(5)]
    for episode_id in ids[:3]:
        await _with_run(backend, episode_id, runs.RunStatus.SUCCEEDED)
    backend.clock.advance(91 * DAY)

    pruned = await _prune(backend, batch=2)

    assert (pruned.reduced, pruned.deleted) == (3, 2)
    assert [await _get(backend, e) is None for e in ids] == [False] * 3 + [True] * 2
    assert [(await _get(backend, e)).annotations for e in ids[:3]] == [{}] * 3
