"""The intake benchmark's traffic is what it claims to be: valid Alertmanager bodies, mostly
repeats, with the requested share of new episodes and a third of those resolved."""

from __future__ import annotations

import itertools

from bench import ingest
from remediator.domain import alerts


def test_benchmark_deliveries_are_valid_mostly_repeats_with_the_requested_new_share():
    bodies = list(itertools.islice(ingest.deliveries(seed=3, new_fraction=0.1), 3000))
    payloads = [alerts.parse_payload(body) for body in bodies]
    first_seen: dict[tuple[str, object], alerts.AlertStatus] = {}
    new_deliveries = resolved = 0
    for payload in payloads:
        keys = [(a.fingerprint, a.starts_at) for a in payload.alerts]
        if any(key not in first_seen for key in keys):
            new_deliveries += 1
            resolved += payload.alerts[0].status is alerts.AlertStatus.RESOLVED
        for alert, key in zip(payload.alerts, keys, strict=True):
            first_seen.setdefault(key, alert.status)
    share = new_deliveries / len(bodies)
    assert 0.08 < share < 0.12  # 10 % asked for; the fixtures' own first sighting adds a few
    assert 0.2 < resolved / new_deliveries < 0.45  # about a third of new episodes resolve


def test_benchmark_without_new_episodes_sends_only_repeats():
    bodies = itertools.islice(ingest.deliveries(new_fraction=0.0), 500)
    keys = {
        (a.fingerprint, a.starts_at) for body in bodies for a in alerts.parse_payload(body).alerts
    }
    fixtures = {
        (a.fingerprint, a.starts_at)
        for path in ingest.FIXTURES.glob("*firing*.json")
        for a in alerts.parse_payload(path.read_bytes()).alerts
    }
    assert keys <= fixtures
