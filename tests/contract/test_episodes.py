"""Episodes as the engine sees them: unhandled until handled in their current status."""

from __future__ import annotations

import datetime as dt

from remediator.domain import alerts
from tests.contract.plans import NODE, fire, run
from tests.support.alerts import alert_body


async def _unhandled(backend):
    return await run(
        backend, lambda tx: [(e.fingerprint, e.status) for e in tx.lock_unhandled_episodes(10)]
    )


async def test_a_firing_alert_is_an_unhandled_episode_with_its_labels(backend):
    episode = await fire(backend)
    assert episode.status is alerts.AlertStatus.FIRING
    assert episode.handled_status is None
    assert episode.labels["node"] == NODE
    assert episode.annotations == {"summary": f"GPUXidError79 on {NODE}"}
    assert episode.alertname == "GPUXidError79"
    assert (episode.ends_at, episode.resolved_at) == (None, None)
    assert episode.created_at == backend.clock.now
    assert episode.generator_url.startswith("http://prometheus.example")


async def test_an_episode_handled_in_its_status_is_unhandled_again_once_it_resolves(backend):
    episode = await fire(backend)
    await run(backend, lambda tx: tx.mark_episode_handled(episode))
    assert await _unhandled(backend) == []
    await fire(backend)  # a repeat changes nothing
    assert await _unhandled(backend) == []
    backend.clock.advance(60)
    resolved = await fire(backend, status="resolved")
    assert resolved.id == episode.id
    assert (resolved.status, resolved.handled_status) == (
        alerts.AlertStatus.RESOLVED,
        alerts.AlertStatus.FIRING,
    )
    assert resolved.resolved_at == backend.clock.now
    assert resolved.ends_at is not None
    await run(backend, lambda tx: tx.mark_episode_handled(resolved))
    assert await _unhandled(backend) == []
    await backend.receive(alert_body(node=NODE, fingerprint="f0"))  # firing after resolved
    stored = await run(backend, lambda tx: tx.get_episode(episode.id))
    assert (stored.status, stored.handled_status) == (alerts.AlertStatus.RESOLVED,) * 2


async def test_handling_marks_the_status_as_read_not_the_status_now(backend):
    episode = await fire(backend)
    await fire(backend, status="resolved")
    await run(backend, lambda tx: tx.mark_episode_handled(episode))  # read while firing
    assert await _unhandled(backend) == [("f0", alerts.AlertStatus.RESOLVED)]


async def test_unhandled_episodes_come_oldest_first_up_to_the_limit(backend):
    for number in range(3):
        await fire(backend, node=f"gpu-node-0{number}", fingerprint=f"f{number}")
    assert await _unhandled(backend) == [(f"f{n}", alerts.AlertStatus.FIRING) for n in range(3)]
    assert await run(
        backend, lambda tx: [e.fingerprint for e in tx.lock_unhandled_episodes(2)]
    ) == ["f0", "f1"]
    assert await run(backend, lambda tx: tx.get_episode(999)) is None


async def test_the_alert_sender_is_the_principal_of_the_episodes_first_delivery(backend):
    await backend.receive(alert_body(node=NODE, fingerprint="f1"), principal="am-primary")
    await backend.receive(alert_body(node=NODE, fingerprint="f1"), principal="am-secondary")
    await backend.receive(alert_body(node=NODE, fingerprint="f2"))
    episodes = await run(
        backend, lambda tx: {e.fingerprint: e.id for e in tx.lock_unhandled_episodes(10)}
    )
    assert await run(backend, lambda tx: tx.alert_sender(episodes["f1"])) == "am-primary"
    assert await run(backend, lambda tx: tx.alert_sender(episodes["f2"])) is None
    assert await run(backend, lambda tx: tx.alert_sender(10**6)) is None


async def test_an_episode_is_found_by_the_fingerprint_and_start_intake_keys_it_on(backend):
    episode = await fire(backend)
    found = await run(backend, lambda tx: tx.find_episode("f0", episode.starts_at))
    assert found is not None
    assert found.id == episode.id
    later = episode.starts_at + dt.timedelta(seconds=1)
    assert await run(backend, lambda tx: tx.find_episode("f0", later)) is None
    assert await run(backend, lambda tx: tx.find_episode("f1", episode.starts_at)) is None
