"""What the operator commands print: an aligned table on a terminal, JSON in a pipe, YAML on
request; ``remediator status`` renders the fleet view a server answers."""

from __future__ import annotations

import asyncio
import io
import json
import re

import pytest
import yaml
from aiohttp import web

from remediator import cli
from remediator.cli import output

FLEET = {  # GET /api/v1/fleet
    "nodes": [
        {
            "name": "gpu-node-01",
            "pool": "a100",
            "state": "healthy",
            "detail": "",
            "runs": [],
            "cappedGpus": [],
            "labels": {"nvidia.com/gpu.count": "8"},
            "cordoned": False,
            "ready": True,
            "knownToCluster": True,
        },
        {
            "name": "gpu-node-03",
            "pool": "h100",
            "state": "cordoned",
            "detail": "cordoned by run 7",
            "runs": [7],
            "cappedGpus": [
                {"uuid": "GPU-659ac159-c80d-597b", "run": 5, "limit": 490.0, "previous": 700.0}
            ],
            "labels": {"gpu-status": "faulty"},
            "cordoned": True,
            "ready": True,
            "knownToCluster": True,
        },
    ],
    "budgets": [{"pool": "h100", "used": 1, "allowed": 1, "nodes": ["gpu-node-03"]}],
    "breaker": {"open": True, "reason": "5 disruptive runs in 10m0s", "openedAt": None},
    "held": [
        {
            "run": 9,
            "step": "drain",
            "action": "node.drain",
            "node": "gpu-node-04",
            "reason": "pool h100: 1 of 1 nodes disrupted",
            "kind": "budget",
            "until": "2026-12-03T08:10:00+00:00",
        }
    ],
    "clusterError": None,
}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_table_and_a_pipe_gets_json():
    assert output.default_format(_Tty()) == "table"
    assert output.default_format(io.StringIO()) == "json"


def test_a_runs_page_is_an_aligned_table_with_the_next_page_named():
    page = {
        "items": [
            {
                "id": 12,
                "status": "waiting_approval",
                "playbook": "gpu-xid-error",
                "node": "gpu-node-03",
                "gpu": "GPU-e9515ed6-254d-5ed7-8e04-aea9cc21a64f",
                "createdAt": "2026-12-03T07:00:01.123456+00:00",
                "reason": None,
            },
            {"id": 3, "status": "succeeded", "playbook": "gpu-temperature-high"},
        ],
        "nextCursor": "3",
    }
    lines = output.render(page, fmt="table", kind="runs").splitlines()
    assert lines[0].startswith("ID  STATUS")
    assert lines[0].endswith("CREATED (UTC)        REASON")
    assert lines[1].split()[:5] == [
        "12",
        "waiting_approval",
        "gpu-xid-error",
        "gpu-node-03",
        "GPU-e9515ed6…",
    ]
    assert "2026-12-03 07:00:01" in lines[1]
    # columns line up: each row's playbook starts where the header's does
    assert lines[1].index("gpu-xid-error") == lines[0].index("PLAYBOOK")
    assert lines[2].index("gpu-temperature-high") == lines[0].index("PLAYBOOK")
    assert lines[-1] == "(more: add --cursor 3)"


def test_a_run_waiting_for_approval_says_how_to_approve_it():
    run = {
        "id": 12,
        "playbook": "gpu-xid-error",
        "kind": "alert",
        "status": "waiting_approval",
        "node": "gpu-node-03",
        "steps": [
            {"id": 40, "key": "cordon", "action": "node.cordon", "status": "succeeded"},
            {
                "id": 41,
                "key": "drain",
                "action": "node.drain",
                "status": "waiting_approval",
                "requiresApproval": True,
                "approvalsRequired": 2,
            },
        ],
        "approvals": [{"stepId": 41, "decision": "approved", "principal": "alice"}],
        "events": [
            {
                "at": f"2026-12-03T07:00:{n:02d}+00:00",
                "actor": "engine",
                "kind": "step.transition",
                "fromStatus": "pending",
                "toStatus": "running",
                "reason": f"event {n}",
            }
            for n in range(20)
        ],
    }
    text = output.render(run, fmt="table", kind="run")
    drain = next(line for line in text.splitlines() if line.startswith("41"))
    assert "1/2" in drain
    cordon = next(line for line in text.splitlines() if line.startswith("40"))
    assert "1/" not in cordon  # a step that needs no approval shows none
    assert "remediator runs approve 12 41 --comment" in text
    assert "(5 earlier events: --output json)" in text
    last = next(line for line in text.splitlines() if line.endswith("event 19"))
    assert last.startswith("2026-12-03 07:00:19  engine  step.transition  pending → running")
    assert "event 4\n" not in text


async def _fleet_server(aiohttp_server, answer=None, status=200):
    seen = []

    async def fleet(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        seen.extend(f"{key}={value}" for key, value in request.query.items())
        return web.json_response(answer if answer is not None else FLEET, status=status)

    app = web.Application()
    app.router.add_get("/api/v1/fleet", fleet)
    server = await aiohttp_server(app)
    return f"127.0.0.1:{server.port}", seen


def test_a_run_that_has_not_started_says_what_it_waits_for():
    run = {"id": 13, "playbook": "gpu-xid-error", "kind": "alert", "status": "pending"}
    shown = output.run_detail(run | {"waitingFor": "node:gpu-node-03", "waitingBehind": 12})
    assert "waiting:  node:gpu-node-03 (held by run #12)" in shown.splitlines()
    slot = output.run_detail(run | {"waitingFor": "slot:gpu-xid-error:", "waitingBehind": None})
    assert "waiting:  slot:gpu-xid-error:" in slot.splitlines()
    assert "waiting" not in output.run_detail(run | {"waitingFor": None})


async def test_status_prints_the_fleet_as_a_table(aiohttp_server, capsys):
    where, seen = await _fleet_server(aiohttp_server)
    argv = ["status", "--server", where, "--token", "t0ken", "--output", "table"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    out = capsys.readouterr().out
    assert seen == ["Bearer t0ken"]
    node = next(line for line in out.splitlines() if line.startswith("gpu-node-03"))
    assert node.split()[:6] == ["gpu-node-03", "h100", "cordoned", "yes", "yes", "#7"]
    assert "GPU-659ac159… 490 W (was 700 W)" in node
    assert node.endswith("cordoned by run 7")
    assert "gpu-status" not in out  # labels are for --output json/yaml
    assert "breaker: OPEN — 5 disruptive runs in 10m0s" in out
    assert "RECHECKED BY (UTC)" in out  # at the latest: a step held by the budget goes sooner
    held = next(line for line in out.splitlines() if line.startswith("9 "))
    assert held.split()[:6] == ["9", "drain", "node.drain", "gpu-node-04", "2026-12-03", "08:10:00"]
    assert held.endswith("pool h100: 1 of 1 nodes disrupted")
    budget = next(line for line in out.splitlines() if line.startswith("h100 "))
    assert budget.split() == ["h100", "1", "1", "gpu-node-03"]


@pytest.mark.parametrize(("fmt", "load"), [("json", json.loads), ("yaml", yaml.safe_load)])
async def test_status_in_json_or_yaml_is_the_server_answer(aiohttp_server, capsys, fmt, load):
    where, _ = await _fleet_server(aiohttp_server)
    assert await asyncio.to_thread(cli.main, ["status", "--server", where, "-o", fmt]) == 0
    assert load(capsys.readouterr().out) == FLEET


async def test_status_of_a_calm_fleet_says_so(aiohttp_server, capsys):
    calm = {"nodes": [], "budgets": [], "breaker": {"open": False}, "held": []}
    where, _ = await _fleet_server(aiohttp_server, calm)
    assert await asyncio.to_thread(cli.main, ["status", "--server", where, "-o", "table"]) == 0
    out = capsys.readouterr().out
    assert "no GPU nodes" in out
    assert "breaker: closed" in out
    assert "held steps: none" in out


async def test_status_of_a_storm_counts_the_held_steps_by_line(aiohttp_server, capsys):
    first = {"run": 11, "step": "cordon", "action": "node.cordon", "node": "gpu-node-11"}
    storm = FLEET | {
        "held": [first | {"reason": "disruption budget in use: 10 of 10 nodes", "until": None}],
        "heldTotal": 2990,
        "lines": [
            {
                "waitingFor": "budget:h100",
                "what": "the disruption budget of pool h100",
                "steps": 2990,
                "first": first,
            },
        ],
        "truncated": ["runs"],
    }
    where, seen = await _fleet_server(aiohttp_server, storm)
    argv = ["status", "--server", where, "-o", "table", "--state", "held"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    assert seen == [None, "state=held"]
    out = capsys.readouterr().out.splitlines()
    assert (
        "2990 held step(s) wait for the disruption budget of pool h100, oldest first; "
        "next: run 11 on gpu-node-11"
    ) in out
    assert "1 of 2990 held steps listed" in out
    assert "more runs than the server reads: the oldest shown" in out


async def test_status_pages_the_nodes_and_says_how_to_ask_for_the_next(aiohttp_server, capsys):
    where, seen = await _fleet_server(
        aiohttp_server, FLEET | {"nodesTotal": 7, "nextCursor": "n-3"}
    )
    argv = ["status", "--server", where, "-o", "table", "--limit", "2", "--cursor", "n-1"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    assert seen == [None, "limit=2", "cursor=n-1"]
    out = capsys.readouterr().out.splitlines()
    shown = len(FLEET["nodes"])
    assert f"{shown} of 7 nodes listed (more: add --cursor n-3)" in out

    where, _ = await _fleet_server(aiohttp_server, FLEET | {"nodesTotal": 7, "nextCursor": None})
    assert await asyncio.to_thread(cli.main, ["status", "--server", where, "-o", "table"]) == 0
    assert f"{shown} of 7 nodes listed (the last of them)" in capsys.readouterr().out.splitlines()
    whole = FLEET | {"nodesTotal": shown, "nextCursor": None}
    where, _ = await _fleet_server(aiohttp_server, whole)
    assert await asyncio.to_thread(cli.main, ["status", "--server", where, "-o", "table"]) == 0
    assert "nodes listed" not in capsys.readouterr().out


@pytest.mark.parametrize("limit", ["0", "5001", "x"])
def test_status_refuses_a_node_limit_out_of_range(capsys, limit):
    with pytest.raises(SystemExit):
        cli.main(["status", "--server", "127.0.0.1:1", "--limit", limit])
    assert "--limit" in capsys.readouterr().err


HOSTILE = "xid \x1b[2J\x1b]0;pwned\x07 \x9b31m \u202eevil\u202c"  # clear, title, CSI, bidi
ESCAPED = "xid \\x1b[2J\\x1b]0;pwned\\x07 \\x9b31m \\u202eevil\\u202c"
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("fmt", ["table", "yaml"])
async def test_what_an_alert_carries_never_reaches_the_terminal_raw(aiohttp_server, capsys, fmt):
    node = FLEET["nodes"][0] | {"detail": HOSTILE, "labels": {"gpu-status": HOSTILE}}
    answer = FLEET | {"nodes": [node], "held": [FLEET["held"][0] | {"reason": HOSTILE}]}
    where, _ = await _fleet_server(aiohttp_server, answer)
    assert await asyncio.to_thread(cli.main, ["status", "--server", where, "-o", fmt]) == 0
    out = capsys.readouterr().out
    assert not _UNSAFE.search(out)
    if fmt == "table":
        assert ESCAPED in out
    else:  # escaped as YAML escapes: it reads back as the server's answer
        assert yaml.safe_load(out) == answer


async def test_an_error_message_is_printed_escaped(aiohttp_server, capsys):
    answer = {"error": {"code": "invalid", "message": HOSTILE}}
    where, _ = await _fleet_server(aiohttp_server, answer, status=400)
    assert await asyncio.to_thread(cli.main, ["status", "--server", where]) == 1
    assert capsys.readouterr().err == f"remediator: HTTP 400: invalid: {ESCAPED}\n"


def test_a_yaml_string_with_only_a_bidi_override_reads_back_the_same():
    value = {"reason": "\u202eevil", "\u2066label": "plain"}
    text = output.render(value, fmt="yaml", kind="result")
    assert not _UNSAFE.search(text)
    assert yaml.safe_load(text) == value


def test_json_escapes_them_itself_and_tables_keep_their_lines():
    assert "\x1b" not in output.render({"reason": HOSTILE}, fmt="json", kind="result")
    text = output.render({"items": [{"id": 1, "reason": HOSTILE}]}, fmt="table", kind="runs")
    assert len(text.splitlines()) == 2  # the header and the run
    assert not _UNSAFE.search(text)


async def test_an_api_error_is_its_code_and_message_on_one_line(aiohttp_server, capsys):
    where, _ = await _fleet_server(
        aiohttp_server, {"error": {"code": "forbidden", "message": "needs read"}}, status=403
    )
    assert await asyncio.to_thread(cli.main, ["status", "--server", where]) == 1
    err = capsys.readouterr().err
    assert err == "remediator: HTTP 403: forbidden: needs read\n"


def test_a_plan_table_says_which_alert_is_deduplicated_and_what_the_others_would_do():
    plan = {
        "cluster": "connected",
        "guards": "evaluated",
        "alerts": [
            {
                "alert": {"alertname": "GPUXidError79", "status": "firing", "fingerprint": "86"},
                "deduplicated": "deduplicated: a repeat of episode 1; it starts no run.",
                "playbooks": [],
            },
            {
                "alert": {"alertname": "GPUTemperatureHigh", "status": "firing"},
                "deduplicated": "",
                "playbooks": [
                    {
                        "playbook": "hot",
                        "node": "gpu-node-01",
                        "gpu": "0",
                        "status": "pending",
                        "steps": [
                            {
                                "key": "drain",
                                "action": "node.drain",
                                "requiresApproval": True,
                                "guard": {"go": False, "reason": "breaker open"},
                                "preview": {"would": "drain gpu-node-01"},
                            }
                        ],
                    }
                ],
            },
        ],
    }
    text = output.render(plan, fmt="table", kind="plan")
    assert "alert: GPUXidError79 firing (fingerprint 86)\n  deduplicated: a repeat" in text
    assert "no playbook matches" not in text
    assert "playbook hot on gpu-node-01 GPU 0: would be pending" in text
    drain = next(line for line in text.splitlines() if line.strip().startswith("drain"))
    assert drain.split()[:4] == ["drain", "node.drain", "yes", "held:"]
    assert drain.endswith("drain gpu-node-01")
