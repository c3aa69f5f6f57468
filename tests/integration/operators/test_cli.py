"""The operator CLI against a real server: runs, approvals, runbooks, breaker, audit."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT
from tests.e2e import procs
from tests.integration.conftest import write_playbooks
from tests.integration.operators.conftest import GATED, MANUAL, TOKENS, alert_body, write_tokens

pytestmark = pytest.mark.timeout(120)


def cli(*args, token="olivia", server=None, check=True):
    env = {"PATH": "/usr/bin:/bin", "REMEDIATOR_TOKEN": TOKENS[token][0]}
    if server:
        env["REMEDIATOR_SERVER"] = server
    done = subprocess.run(
        [sys.executable, "-m", "remediator", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


@pytest.fixture
def server(tmp_path):
    db = tmp_path / "db.sqlite"
    env = {
        "REMEDIATOR_PLUGINS": '["tests.support.recording"]',
        "REMEDIATOR_TEST_RECORD": str(tmp_path / "records.jsonl"),
        "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{db}",
        "REMEDIATOR_RULES": str(write_playbooks(tmp_path / "rules", GATED, MANUAL)),
        "REMEDIATOR_TOKENS": str(write_tokens(tmp_path)),
        "REMEDIATOR_POLL_INTERVAL": "0.1",
    }
    serve = procs.Serve(env=env, log=tmp_path / "serve.log").start()
    serve.db_url = env["REMEDIATOR_DATABASE_URL"]
    try:
        yield serve
    finally:
        serve.terminate()


def _wait_for(predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError


def test_operator_cli_approves_triggers_and_verifies_the_audit_log(server, tmp_path):
    posted = httpx.post(
        f"{server.url}/api/v1/alerts",
        content=alert_body(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKENS['alertmanager'][0]}",
        },
    )
    assert posted.status_code == 200

    def waiting():
        runs = json.loads(
            cli("runs", "list", "--status", "waiting_approval", server=server.url).stdout
        )
        return runs["items"]

    [run] = _wait_for(waiting)
    detail = json.loads(cli("runs", "show", str(run["id"]), server=server.url).stdout)
    step = next(s for s in detail["steps"] if s["status"] == "waiting_approval")
    approved = cli(
        "runs",
        "approve",
        str(run["id"]),
        str(step["id"]),
        "--comment",
        "ok from the CLI",
        server=server.url,
    )
    assert json.loads(approved.stdout)["status"] == "pending"
    again = cli(
        "runs",
        "approve",
        str(run["id"]),
        str(step["id"]),
        "--comment",
        "again",
        server=server.url,
        check=False,
    )
    assert again.returncode == 1
    assert "409" in again.stderr
    triggered = cli(
        "runbook",
        "trigger",
        "return-to-service",
        "--node",
        "gpu-node-07",
        "--param",
        "reason=fixed",
        server=server.url,
    )
    assert json.loads(triggered.stdout)["principal"] == "olivia"
    bad = cli(
        "runbook", "trigger", "return-to-service", "--node", "n1", server=server.url, check=False
    )
    assert bad.returncode == 1
    assert "params.reason" in bad.stderr
    denied = cli("audit", "verify", token="olivia", server=server.url, check=False)
    assert denied.returncode == 1
    export = tmp_path / "export.jsonl"
    cli("audit", "export", "--output", str(export), token="ada", server=server.url)
    assert export.read_text().count("\n") > 5
    offline = json.loads(cli("audit", "verify", "--file", str(export), token="ada").stdout)
    assert offline["ok"] is True
    online = json.loads(cli("audit", "verify", token="ada", server=server.url).stdout)
    assert online["ok"] is True
    database = cli("audit", "verify", "--database-url", server.db_url, token="ada")
    assert json.loads(database.stdout)["ok"] is True
    breaker = cli("breaker", "status", server=server.url, check=False)
    assert breaker.returncode == 0, breaker.stderr
