"""An insider with write access to the database, but not to the audit key or the anchor file,
cannot rewrite history unnoticed: ``remediator audit verify`` finds every edit below."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import pathlib
from typing import Any

import pytest
import sqlalchemy as sa

import remediator.app as app_mod
from remediator import cli
from remediator.adapters import auditfiles
from remediator.adapters.db import tables
from remediator.cli import client as client_mod
from remediator.domain import audit
from tests.integration.operators.conftest import GATED, alert_body, waiting_step

A = tables.audit_events
H = tables.audit_head
KEY_A = "k8s-2026-11"
KEY_B = "k8s-2026-12"


def _keys(directory: pathlib.Path, *names: str) -> pathlib.Path:
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).write_bytes(hashlib.sha256(name.encode()).hexdigest().encode())
    return directory


@pytest.fixture
def keyed(tmp_path: pathlib.Path) -> dict[str, Any]:
    return {
        "audit_key_file": _keys(tmp_path / "audit-keys", KEY_A),
        "audit_anchor_file": tmp_path / "anchors.jsonl",
    }


async def _history(make_harness: Any, settings: dict[str, Any]) -> Any:
    """A run that waited for approval and was approved, anchored afterwards."""
    h = await make_harness(GATED, **settings)
    response = await h.post(alert_body(node="gpu-node-01"))
    assert response.status == 200, await response.text()
    await h.settle()
    run_id, step_id = await waiting_step(h)
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
    response = await h.client.post(url, json={"comment": "drain it"})
    assert response.status == 200, await response.text()
    await h.settle()
    assert await app_mod.anchor_once(h.components) is not None
    return h


async def _verify(h: Any, *extra: str) -> dict[str, Any]:
    """``remediator audit verify`` against the harness's database, as an auditor runs it."""
    settings = h.components.settings
    argv = ["audit", "verify", "--database-url", settings.database_url, *extra]
    if settings.audit_key_file is not None and "--audit-key-file" not in extra:
        argv += ["--audit-key-file", str(settings.audit_key_file)]
    if settings.audit_anchor_file is not None:
        argv += ["--anchors", str(settings.audit_anchor_file)]
    out = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out):
            return cli.main(argv)

    code = await asyncio.to_thread(run)
    report: dict[str, Any] = json.loads(out.getvalue())
    assert (code == 0) is report["ok"]
    return report


async def _events(h: Any) -> list[dict[str, Any]]:
    async with h.components.db.read("test") as conn:
        return [dict(row._mapping) for row in await conn.execute(sa.select(A).order_by(A.c.id))]


async def _write(h: Any, *statements: Any) -> None:
    async with h.components.db.write("tamper") as conn:
        for statement in statements:
            await conn.execute(statement)


def _unkeyed_chain(events: list[dict[str, Any]], start: int) -> list[Any]:
    """Statements that relink every event from ``start`` with plain sha256 (the insider has no
    key), and the head: a chain that is internally consistent."""
    statements = []
    prev = next((e["hash"] for e in events if e["id"] == start - 1), audit.GENESIS)
    for event in events:
        if event["id"] < start:
            continue
        event = {**event, "key_id": None, "prev_hash": prev}
        event["hash"] = audit.chain_hash(prev, event)
        statements.append(
            sa.update(A)
            .where(A.c.id == event["id"])
            .values(actor=event["actor"], key_id=None, prev_hash=prev, hash=event["hash"])
        )
        prev = event["hash"]
    statements.append(sa.update(H).values(last_id=events[-1]["id"], last_hash=prev))
    return statements


async def test_an_untouched_keyed_chain_verifies_with_rows_anchors_and_deliveries(
    make_harness, keyed
):
    h = await _history(make_harness, keyed)
    events = await _events(h)
    assert {event["key_id"] for event in events} == {KEY_A}
    sealed = {table for event in events for table in event["rows"] or {}}
    assert sealed == {"runs", "steps", "approvals"}
    report = await _verify(h)
    assert report["ok"] is True, report
    assert report["anchors"] == 1
    assert report["rows"] >= 4  # the run, its two steps, the approval
    assert report["deliveries"] == 1
    online = await h.client.get("/api/v1/audit/verify")
    assert (await online.json())["ok"] is True


async def test_an_edited_event_with_the_chain_recomputed_is_detected(make_harness, keyed):
    h = await _history(make_harness, keyed)
    events = await _events(h)
    target = events[2]["id"]
    tampered = [{**e, "actor": "mallory"} if e["id"] == target else e for e in events]
    await _write(h, *_unkeyed_chain(tampered, target))
    report = await _verify(h)
    assert report["ok"] is False
    assert report["firstBrokenId"] == target
    assert "unkeyed event" in report["reason"]


async def test_a_chain_rewritten_unkeyed_from_genesis_is_caught_by_its_anchor(make_harness, keyed):
    h = await _history(make_harness, keyed)
    events = await _events(h)
    tampered = [{**e, "actor": "mallory"} if e["id"] == 2 else e for e in events]
    await _write(h, *_unkeyed_chain(tampered, 1))
    report = await _verify(h)
    assert report["ok"] is False
    assert "anchor" in report["reason"], report


async def test_a_forged_event_appended_to_the_chain_is_detected(make_harness, keyed):
    h = await _history(make_harness, keyed)
    last = (await _events(h))[-1]
    forged = {
        **{field: last[field] for field in audit.CONTENT_FIELDS},
        "id": last["id"] + 1,
        "kind": "step.approval",
        "actor": "mallory",
        "reason": "approved",
        "key_id": KEY_A,
        "rows": None,
    }
    forged_hash = audit.chain_hash(last["hash"], {**forged, "key_id": None})
    await _write(
        h,
        sa.insert(A).values(**forged, prev_hash=last["hash"], hash=forged_hash),
        sa.update(H).values(last_id=forged["id"], last_hash=forged_hash),
    )
    report = await _verify(h)
    assert report["ok"] is False
    assert report["firstBrokenId"] == forged["id"]
    assert report["reason"] == "content does not match its hash"


async def test_a_cut_tail_with_the_head_rewritten_is_caught_by_the_anchor(make_harness, keyed):
    h = await _history(make_harness, keyed)
    events = await _events(h)
    keep = events[-4]
    await _write(
        h,
        sa.delete(A).where(A.c.id > keep["id"]),
        sa.update(H).values(last_id=keep["id"], last_hash=keep["hash"]),
    )
    report = await _verify(h)
    assert report["ok"] is False
    assert report["firstBrokenId"] == events[-1]["id"]
    assert "is not in the chain" in report["reason"]


async def test_deleting_the_whole_log_is_caught_by_the_anchor(make_harness, keyed):
    h = await _history(make_harness, keyed)
    await _write(h, sa.delete(A), sa.delete(H))
    report = await _verify(h)
    assert report["ok"] is False
    assert "anchored" in report["reason"]


@pytest.mark.parametrize(
    ("table", "change", "reason"),
    [
        (tables.approvals, {"principal": "mallory"}, "approvals row 1 was changed"),
        (tables.approvals, {"comment": "never said that"}, "approvals row 1 was changed"),
        (tables.runs, {"principal": "mallory"}, "runs row 1 was changed"),
        (tables.steps, {"output": {"forged": True}}, "steps row 1 was changed"),
    ],
)
async def test_edits_to_runs_steps_and_approvals_are_detected(
    make_harness, keyed, table, change, reason
):
    h = await _history(make_harness, keyed)
    assert (await _verify(h))["ok"] is True
    await _write(h, sa.update(table).where(table.c.id == 1).values(**change))
    report = await _verify(h)
    assert report["ok"] is False
    assert report["reason"].startswith(reason), report


async def test_an_approval_inserted_or_deleted_outside_the_chain_is_detected(make_harness, keyed):
    h = await _history(make_harness, keyed)
    AP = tables.approvals
    async with h.components.db.read("test") as conn:
        approval = dict((await conn.execute(sa.select(AP))).one()._mapping)
    await _write(
        h,
        sa.insert(AP).values({**approval, "id": 2, "principal": "mallory", "decision": "approve"}),
    )
    assert (await _verify(h))["reason"] == "approvals row 2 is not in the audit chain"
    await _write(h, sa.delete(AP))
    assert (await _verify(h))["reason"] == "approvals row 1 was deleted"


async def test_an_edited_raw_delivery_is_detected(make_harness, keyed):
    h = await _history(make_harness, keyed)
    D = tables.deliveries
    await _write(h, sa.update(D).where(D.c.id == 1).values(principal="someone-else"))
    report = await _verify(h)
    assert report["ok"] is False
    assert report["reason"] == "delivery 1 was changed outside remediator"


async def test_an_anchor_forged_without_the_key_is_refused(make_harness, keyed):
    h = await _history(make_harness, keyed)
    path = keyed["audit_anchor_file"]
    [anchor] = auditfiles.read_anchors(path)
    forged = audit.Anchor(anchor.last_id, "0" * 64, anchor.at, f"{KEY_A}:{'0' * 64}")
    auditfiles.append_anchor(path, forged)
    report = await _verify(h)
    assert report["ok"] is False
    assert "not signed by a configured key" in report["reason"]


async def test_rotation_keeps_old_keys_for_verification(make_harness, tmp_path, keyed):
    h = await _history(make_harness, keyed)
    rotated = _keys(tmp_path / "audit-keys", KEY_A, KEY_B)
    h2 = await make_harness(GATED, **keyed, audit_key_id=KEY_B)
    await h2.post(alert_body(node="gpu-node-02"))
    await h2.settle()
    assert {e["key_id"] for e in await _events(h2)} == {KEY_A, KEY_B}
    assert (await _verify(h2, "--audit-key-id", KEY_B))["ok"] is True
    only_new = _keys(tmp_path / "only-new", KEY_B)
    report = await _verify(h2, "--audit-key-file", str(only_new))
    assert report["ok"] is False
    assert repr(KEY_A) in report["reason"]  # the anchor, then the events it signed
    assert rotated.exists()
    assert h is not None


async def test_offline_export_verification_needs_the_key_for_keyed_events(
    make_harness, keyed, tmp_path
):
    h = await _history(make_harness, keyed)
    response = await h.client.get("/api/v1/audit/export")
    path = tmp_path / "export.jsonl"
    path.write_bytes(await response.read())
    keys = auditfiles.load_keys(keyed["audit_key_file"])
    assert client_mod.verify_export(path, keys).ok
    without = client_mod.verify_export(path)
    assert not without.ok
    assert "no audit key is configured" in without.reason


async def test_an_anchor_is_written_only_when_the_head_moved(make_harness, keyed):
    h = await _history(make_harness, keyed)
    assert await app_mod.anchor_once(h.components) is None
    await h.post(alert_body(node="gpu-node-02"))
    await h.settle()
    moved = await app_mod.anchor_once(h.components)
    assert moved is not None
    anchors = auditfiles.read_anchors(keyed["audit_anchor_file"])
    assert [a.last_id for a in anchors] == [anchors[0].last_id, moved.last_id]
    assert anchors[0].last_id < moved.last_id
