"""The benchmark harness's arithmetic and output: percentiles as numpy defines them, one
Markdown table whatever the cells hold, wrk's report read right, bodies for any node."""

from __future__ import annotations

import json
import math

import pytest

from bench import instructions, intake, table, world
from remediator.domain import alerts

WRK_REPORT = """Running 3s test @ http://127.0.0.1:8080/api/v1/alerts
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    20.01ms    5.12ms  80.00ms   90.00%
  Latency Distribution
     50%   18.50ms
     75%   22.00ms
     90%   27.10ms
     99%    1.20s
  9000 requests in 3.00s, 1.20MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   2999.50
Transfer/sec:    400.00KB
"""


def test_percentiles_interpolate_between_closest_ranks():
    values = [0.4, 0.1, 0.3, 0.2]
    assert table.percentile(values, 0) == 0.1
    assert table.percentile(values, 100) == 0.4
    assert math.isclose(table.percentile(values, 50), 0.25)
    assert math.isclose(table.percentile(values, 90), 0.37)
    assert math.isnan(table.percentile([], 50))
    assert table.latencies([]) == "- / - / - ms"


def test_table_is_one_markdown_table_with_escaped_cells():
    rows = [table.Row("intake", "sqlite", "1,000 (ratio 0.90)", "≥ 0.9", "a | b")]
    text = table.render(rows, title="run")
    lines = text.splitlines()
    assert lines[0] == "### run"
    assert lines[2].startswith("| measure | backend |")
    assert lines[-1] == "| intake | sqlite | 1,000 (ratio 0.90) | ≥ 0.9 | a \\| b |"
    assert table.ratio(1.0, 0.0) == "-"


def test_wrk_report_gives_rate_percentiles_and_every_failed_request():
    got = intake.parse_wrk(WRK_REPORT)
    assert got.rate == 2999.5
    assert math.isclose(got.p50, 0.0185)
    assert math.isclose(got.p99, 1.2)
    assert got.errors == 7


def test_benchmark_alert_is_the_real_xid_delivery_moved_to_the_node():
    body = world.alert_body("gpu-node-0042", 42)
    payload = alerts.parse_payload(body)
    (alert,) = payload.alerts
    assert alert.labels["node"] == "gpu-node-0042"
    assert alert.labels["alertname"] == "GPUXidError79"
    assert alert.fingerprint == f"{42:016x}"
    assert json.loads(body)["groupLabels"]["node"] == "gpu-node-0042"


def test_no_postgres_leaves_only_sqlite_and_quick_caps_the_sizes(tmp_path, monkeypatch):
    from bench import run

    monkeypatch.delenv("BENCH_QUICK", raising=False)
    args = run.parse_arguments(["--quick", "--no-postgres", "--burst", "50"])
    plan = run.plan_from(args, tmp_path)
    assert plan.postgres is None
    assert list(plan.backends()) == ["sqlite"]
    assert plan.quick
    assert plan.burst == 50
    assert max(plan.episode_counts) <= 10**4


CALLGRIND_DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 8082
cmd:  python -m remediator serve
part: 1

desc: Trigger: Client Request: dump
positions: line
events: Ir
summary: 627364000
fl= (1)
fn= (1)
0 3
totals: 627364000
"""


def test_a_callgrind_dump_gives_its_instructions_and_a_missing_total_is_refused():
    assert instructions.parse_totals(CALLGRIND_DUMP) == 627_364_000
    got = instructions.Instructions(remediator=600_000.0, bare=450_000.0, deliveries=1000)
    assert got.ratio == 0.75
    with pytest.raises(ValueError, match="no totals"):
        instructions.parse_totals(CALLGRIND_DUMP.replace("totals:", "total:"))
