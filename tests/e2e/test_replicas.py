"""Two ``remediator serve`` processes on one Postgres share 200 alerts: every run completes,
no step is applied twice, and both replicas do part of the work."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.e2e.procs import Serve, alert, wait_for
from tests.integration.conftest import write_playbooks
from tests.support import recording

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PLAYBOOK = """
name: two-steps
match: {alertname: GPUXidError79}
concurrency: 200
steps:
  - {id: a, action: test.record, params: {label: a}}
  - {id: b, action: test.record, params: {label: b}}
"""


def test_two_replicas_on_postgres_never_apply_a_step_twice(tmp_path, pg_url):
    rules = write_playbooks(tmp_path / "rules", PLAYBOOK)
    records = tmp_path / "records.jsonl"
    env = {
        "REMEDIATOR_DATABASE_URL": pg_url,
        "REMEDIATOR_RULES": str(rules),
        "REMEDIATOR_PLUGINS": json.dumps(["tests.support.recording"]),
        "REMEDIATOR_POLL_INTERVAL": "0.05",
        recording.ENV: str(records),
    }
    migrated = subprocess.run(
        [sys.executable, "-m", "remediator", "migrate"],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert migrated.returncode == 0, migrated.stderr
    replicas = [
        Serve(env=env | {"REMEDIATOR_WORKER_ID": f"replica-{i}"}, log=tmp_path / f"{i}.log")
        for i in range(2)
    ]
    try:
        for replica in replicas:
            replica.start()
        nodes = [f"gpu-node-{i:03d}" for i in range(200)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(
                pool.map(lambda n: replicas[hash(n) % 2].post(alert(n)).status_code, nodes)
            )
        assert statuses == [200] * 200

        def finished():
            items = replicas[0].get("/api/v1/runs", limit=500, status="succeeded")["items"]
            return len(items) == 200

        wait_for(finished, 120, interval=0.5, what="200 runs succeeded")
    finally:
        for replica in replicas:
            replica.kill()
    applied = [r for r in recording.read_records(records) if r["kind"] == "apply"]
    counts = collections.Counter(r["key"] for r in applied)
    assert len(counts) == 400
    assert max(counts.values()) == 1
    assert len({r["pid"] for r in applied}) == 2
