from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sqlite3

import pytest

from remediator.domain import auth
from tests.conftest import _psql, am_fixture, am_fixture_paths, am_payload

RECORD_ALL = """
name: record-all
match:
  alertname: [GPUTemperatureHigh, GPUTemperatureCritical, GPUECCUncorrectableError,
              GPUUtilizationLow, GPUXidError79]
exclusive: false
steps:
  - {id: rec, action: test.record, params: {label: "{{ alert.alertname }}"}}
"""

SECOND = """
name: xid-second
match: {alertname: GPUXidError79, matchers: ['severity="critical"']}
exclusive: false
steps:
  - {id: rec, action: test.record, params: {label: second}}
"""


async def _episodes(h):
    response = await h.client.get("/api/v1/alerts", params={"limit": "500"})
    assert response.status == 200
    return (await response.json())["items"]


@pytest.mark.parametrize("path", am_fixture_paths(), ids=lambda p: p.stem)
async def test_every_real_body_is_accepted_and_stored_as_episodes(make_harness, path):
    h = await make_harness(RECORD_ALL)
    response = await h.post(path.read_bytes())
    assert response.status == 200, await response.text()
    body = await response.json()
    raw = json.loads(path.read_bytes())
    assert body["alerts"] == len(raw["alerts"])
    stored = await _episodes(h)
    assert sorted(e["fingerprint"] for e in stored) == sorted(
        a["fingerprint"] for a in raw["alerts"]
    )
    for episode in stored:
        original = next(a for a in raw["alerts"] if a["fingerprint"] == episode["fingerprint"])
        assert episode["status"] == original["status"]
        assert episode["labels"] == original["labels"]


async def test_fifty_repeats_make_one_episode_and_one_run_per_playbook(make_harness):
    h = await make_harness(RECORD_ALL, SECOND)
    body = am_fixture("GPUXidError79-firing-1alerts")
    for _ in range(50):
        response = await h.post(body)
        assert response.status == 200
        await h.settle()
    assert len(await _episodes(h)) == 1
    runs = await h.runs()
    assert sorted(r["playbook"] for r in runs) == ["record-all", "xid-second"]
    assert sorted(r["label"] for r in h.records() if r["kind"] == "apply") == [
        "GPUXidError79",
        "second",
    ]


async def test_concurrent_identical_deliveries_make_one_episode_and_one_run(make_harness):
    h = await make_harness(RECORD_ALL)
    body = am_fixture("GPUECCUncorrectableError-firing-1alerts")
    responses = await asyncio.gather(*(h.post(body) for _ in range(20)))
    assert [r.status for r in responses] == [200] * 20
    changed = [(await r.json())["changed"] for r in responses]
    assert sum(changed) == 1
    await h.settle()
    assert len(await _episodes(h)) == 1
    assert len(await h.runs()) == 1
    assert len([r for r in h.records() if r["kind"] == "apply"]) == 1


async def test_resolution_lands_on_the_same_episode(make_harness):
    h = await make_harness(RECORD_ALL)
    await h.post(am_fixture("GPUXidError79-firing-1alerts"))
    await h.post(am_fixture("GPUXidError79-resolved-1alerts"))
    episodes = await _episodes(h)
    assert len(episodes) == 1
    assert episodes[0]["status"] == "resolved"
    assert episodes[0]["endsAt"].startswith("2026-11-30T00:02:30.47")


async def test_a_late_firing_repeat_does_not_reopen_a_resolved_episode(make_harness):
    h = await make_harness(RECORD_ALL)
    await h.post(am_fixture("GPUXidError79-resolved-1alerts"))
    response = await h.post(am_fixture("GPUXidError79-firing-1alerts"))
    assert (await response.json())["changed"] == 0
    assert (await _episodes(h))[0]["status"] == "resolved"
    await h.settle()
    assert await h.runs() == []


async def test_partial_resolution_resolves_only_that_alert(make_harness):
    h = await make_harness(RECORD_ALL)
    await h.post(am_fixture("GPUTemperatureHigh-firing-2alerts"))
    await h.post(am_fixture("GPUTemperatureHigh-firing-partial-2alerts"))
    by_fp = {e["fingerprint"]: e["status"] for e in await _episodes(h)}
    assert by_fp == {"0a87c59111a8bf1f": "resolved", "eca97da842e39aab": "firing"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"status": "firing"}', "alerts"),
        (b'{"version": "4", "status": "firing", "alerts": [{"status": "burning"}]}', "alerts.0"),
        (b"[1, 2, 3]", "(body)"),
        (b"{not json", "(body)"),
    ],
)
async def test_invalid_bodies_get_400_with_field_errors(make_harness, body, field):
    h = await make_harness(RECORD_ALL)
    response = await h.post(body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "invalid_payload"
    assert any(f["field"].startswith(field) for f in error["fields"]), error


async def test_non_utf8_body_is_refused(make_harness):
    h = await make_harness(RECORD_ALL)
    response = await h.post(b'{"receiver": "\xff\xfe"}')
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_encoding"


async def test_non_json_content_type_gets_415(make_harness):
    h = await make_harness(RECORD_ALL)
    response = await h.client.post(
        "/api/v1/alerts",
        data=am_fixture("GPUXidError79-firing-1alerts"),
        headers={"Content-Type": "text/plain"},
    )
    assert response.status == 415
    assert (await response.json())["error"]["code"] == "unsupported_media_type"


async def test_oversized_body_gets_413_and_stores_nothing(make_harness):
    h = await make_harness(RECORD_ALL, max_body_bytes=4096)
    raw = am_payload("GPUXidError79-firing-1alerts")
    raw["alerts"][0]["annotations"]["description"] = "x" * 5000
    response = await h.post(json.dumps(raw).encode())
    assert response.status == 413
    assert await _episodes(h) == []


async def test_charset_parameter_is_accepted(make_harness):
    h = await make_harness(RECORD_ALL)
    response = await h.client.post(
        "/api/v1/alerts",
        data=am_fixture("GPUXidError79-firing-1alerts"),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert response.status == 200


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(
        f"""
- name: alertmanager
  token_sha256: {auth.hash_token("ingest-token-0123456789")}
  roles: [ingest]
- name: auditor
  token: auditor-token-0123456789
  roles: [auditor]
"""
    )
    return path


async def test_missing_or_wrong_credentials_get_401(make_harness, tokens_file):
    h = await make_harness(RECORD_ALL, tokens=tokens_file)
    body = am_fixture("GPUXidError79-firing-1alerts")
    assert (await h.post(body)).status == 401
    assert (await h.post(body, Authorization="Bearer wrong-token-0000000000")).status == 401
    assert (await h.post(body, Authorization="Basic !!!")).status == 401
    assert await _episodes_as(h, "auditor-token-0123456789") == []


async def _episodes_as(h, token):
    response = await h.client.get("/api/v1/alerts", headers={"Authorization": f"Bearer {token}"})
    assert response.status == 200
    return (await response.json())["items"]


async def test_bearer_and_basic_auth_are_accepted(make_harness, tokens_file):
    h = await make_harness(RECORD_ALL, tokens=tokens_file)
    body = am_fixture("GPUXidError79-firing-1alerts")
    bearer = await h.post(body, Authorization="Bearer ingest-token-0123456789")
    assert bearer.status == 200
    basic = base64.b64encode(b"alertmanager:ingest-token-0123456789").decode()
    assert (await h.post(body, Authorization=f"Basic {basic}")).status == 200
    wrong_name = base64.b64encode(b"auditor:ingest-token-0123456789").decode()
    assert (await h.post(body, Authorization=f"Basic {wrong_name}")).status == 401


async def test_roles_without_ingest_get_403(make_harness, tokens_file):
    h = await make_harness(RECORD_ALL, tokens=tokens_file)
    response = await h.post(
        am_fixture("GPUXidError79-firing-1alerts"), Authorization="Bearer auditor-token-0123456789"
    )
    assert response.status == 403
    ingest = await h.client.get(
        "/api/v1/runs", headers={"Authorization": "Bearer ingest-token-0123456789"}
    )
    assert ingest.status == 403


async def test_store_outage_answers_503_with_retry_after_and_loses_nothing(make_harness):
    h = await make_harness(RECORD_ALL, database_timeout=0.3)
    body = am_fixture("GPUXidError79-firing-1alerts")
    async with outage(h.components.db):
        response = await h.post(body)
        assert response.status == 503
        assert response.headers["Retry-After"] == "5"
        assert (await response.json())["error"]["code"] == "unavailable"
        assert (await h.client.get("/readyz")).status == 503
    retried = await h.post(body)
    assert retried.status == 200
    assert (await retried.json())["changed"] == 1
    assert len(await _episodes(h)) == 1


@contextlib.asynccontextmanager
async def outage(db):
    """A real outage: SQLite locked by another writer; Postgres refusing connections."""
    if db.is_sqlite:
        path = db.url.split("///", 1)[1]
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        return
    name = db.url.rsplit("/", 1)[1]
    await db.engine.dispose()
    _psql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    _psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
    try:
        yield
    finally:
        _psql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")


async def test_health_ready_and_metrics(make_harness):
    h = await make_harness(RECORD_ALL)
    assert (await h.client.get("/healthz")).status == 200
    ready = await h.client.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["checks"]["playbooks"] == "1 loaded"
    await h.post(am_fixture("GPUXidError79-firing-1alerts"))
    await h.post(am_fixture("GPUXidError79-firing-1alerts"))
    await h.post(b"{}")
    text = await (await h.client.get("/metrics")).text()
    assert 'remediator_alerts_received_total{status="firing"} 2.0' in text
    assert "remediator_alerts_deduplicated_total 1.0" in text
    assert 'remediator_deliveries_rejected_total{reason="invalid_payload"} 1.0' in text
