"""A real ``remediator serve`` killed with SIGKILL at several points, then restarted:
every run completes and every step's side effect is applied exactly once."""

from __future__ import annotations

import collections
import json

import pytest

from tests.conftest import fresh_pg_database
from tests.e2e.procs import Serve, alert, wait_for
from tests.integration.conftest import write_playbooks
from tests.support import recording

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PLAYBOOK = """
name: three-steps
match: {alertname: GPUXidError79}
steps:
  - {id: a, action: test.record, params: {label: a, sleep_after: 3}}
  - {id: b, action: test.record, params: {label: b, sleep_before: 3}}
  - {id: c, action: test.record, params: {label: c}}
"""


@pytest.fixture(params=["sqlite", "postgres"])
def env(request, tmp_path):
    rules = write_playbooks(tmp_path / "rules", PLAYBOOK)
    records = tmp_path / "records.jsonl"
    base = {
        "REMEDIATOR_RULES": str(rules),
        "REMEDIATOR_PLUGINS": json.dumps(["tests.support.recording"]),
        "REMEDIATOR_LEASE_SECONDS": "1.5",
        "REMEDIATOR_POLL_INTERVAL": "0.1",
        "REMEDIATOR_SHUTDOWN_GRACE": "0.5",
        recording.ENV: str(records),
        "PYTHONPATH": str(tmp_path.parent),
    }
    if request.param == "sqlite":
        yield base | {"REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"}
    else:
        for url in fresh_pg_database():
            yield base | {"REMEDIATOR_DATABASE_URL": url, "REMEDIATOR_MIGRATE_ON_START": "true"}


def _records(env, kind):
    return [r for r in recording.read_records(_path(env)) if r["kind"] == kind]


def _path(env):
    import pathlib

    return pathlib.Path(env[recording.ENV])


def test_sigkill_at_several_points_applies_each_effect_exactly_once(env, tmp_path):
    log = tmp_path / "serve.log"
    serve = Serve(env=env, log=log).start()
    try:
        # 1. Killed right after the webhook answered: the stored alert is not lost.
        assert serve.post(alert("gpu-node-01")).status_code == 200
        serve.kill()
        serve.start()
        # 2. Killed while step a has applied its effect but not recorded its outcome.
        wait_for(lambda: _records(env, "apply"), 30, what="step a applied")
        serve.kill()
        serve.start()
        # 3. Killed while step b is running, before its effect.
        wait_for(
            lambda: [r for r in _records(env, "start") if r["label"] == "b"], 30, what="b started"
        )
        serve.kill()
        serve.start()
        runs = wait_for(
            lambda: [r for r in serve.get("/api/v1/runs")["items"] if r["status"] == "succeeded"],
            60,
            what="run succeeded",
        )
        detail = serve.get(f"/api/v1/runs/{runs[0]['id']}")
    finally:
        serve.kill()
    applied = collections.Counter(r["label"] for r in _records(env, "apply"))
    assert applied == {"a": 1, "b": 1, "c": 1}
    steps = {s["key"]: s for s in detail["steps"]}
    assert steps["a"]["output"].get("already_in_place") is True
    assert steps["b"]["attempt"] >= 2
    assert len({r["pid"] for r in _records(env, "start")}) >= 2


def test_sigterm_hands_back_in_flight_steps_and_exits_cleanly(env, tmp_path):
    log = tmp_path / "serve.log"
    serve = Serve(env=env, log=log).start()
    try:
        assert serve.post(alert("gpu-node-02")).status_code == 200
        wait_for(lambda: _records(env, "apply"), 30, what="step a applied")
        wait_for(
            lambda: [r for r in _records(env, "start") if r["label"] == "b"], 30, what="b started"
        )
        assert serve.terminate() == 0
        serve.start()
        wait_for(
            lambda: [r for r in serve.get("/api/v1/runs")["items"] if r["status"] == "succeeded"],
            60,
            what="run succeeded",
        )
        run_id = serve.get("/api/v1/runs")["items"][0]["id"]
        events = serve.get(f"/api/v1/runs/{run_id}")["events"]
    finally:
        serve.kill()
    assert any("handed back" in e["reason"] for e in events)
    applied = collections.Counter(r["label"] for r in _records(env, "apply"))
    assert applied == {"a": 1, "b": 1, "c": 1}
