"""The retention pass of the real app: alert episodes past ``alert_retention_days`` keep only
what the audit needs, or go; their runs stay; 0 keeps everything."""

from __future__ import annotations

import remediator.app as app_mod
from tests.support.alerts import alert_body

PLAYBOOK = """
name: note
match: {alertname: GPUXidError79}
steps:
  - {id: note, action: test.record, params: {label: note}}
"""
PRIVATE = {"namespace": "team-a", "pod": "train-llm-7f9c"}
DAY = 86400


async def _deliver(h, **kwargs):
    response = await h.post(alert_body(extra_labels=PRIVATE, **kwargs))
    assert response.status == 200, await response.text()
    await h.settle()


async def _episode(h, episode_id):
    return await h.store.run("test", lambda tx: tx.get_episode(episode_id))


async def test_expired_episodes_are_reduced_or_deleted_and_their_runs_kept(make_harness, clock):
    h = await make_harness(PLAYBOOK, alert_retention_days=30)
    await _deliver(h)
    await _deliver(h, status="resolved")
    await _deliver(h, alertname="NoPlaybook", fingerprint="f-unmatched")
    await _deliver(h, alertname="NoPlaybook", fingerprint="f-unmatched", status="resolved")
    [summary] = await h.runs()
    detail = await h.run_detail(summary["id"])
    assert detail["status"] == "succeeded"
    episode_id = (await h.store.run("t", lambda tx: tx.get_run(summary["id"]))).episode_id
    unmatched = episode_id + 1
    while await _episode(h, unmatched) is None:  # Postgres upserts may skip ids
        unmatched += 1
    clock.advance(29 * DAY)
    await app_mod.retention_pass(h.components)
    assert (await _episode(h, episode_id)).labels["pod"] == "train-llm-7f9c"

    clock.advance(2 * DAY)
    await app_mod.retention_pass(h.components)

    episode = await _episode(h, episode_id)
    assert episode.labels == {
        "alertname": "GPUXidError79",
        "node": "gpu-node-03",
        "severity": "critical",
    }
    assert (episode.annotations, episode.generator_url) == ({}, "")
    assert await _episode(h, unmatched) is None
    assert (await h.run_detail(summary["id"]))["status"] == "succeeded"
    verified = await h.client.get("/api/v1/audit/verify")
    assert (await verified.json())["ok"] is True


async def test_zero_keeps_alert_episodes_whole(make_harness, clock):
    h = await make_harness(PLAYBOOK, alert_retention_days=0)
    await _deliver(h)
    await _deliver(h, status="resolved")
    [summary] = await h.runs()
    episode_id = (await h.store.run("t", lambda tx: tx.get_run(summary["id"]))).episode_id
    clock.advance(3650 * DAY)
    await app_mod.retention_pass(h.components)
    assert (await _episode(h, episode_id)).labels["pod"] == "train-llm-7f9c"
