"""Chaos: a storm of real GPU alerts against a real ``remediator serve`` that is SIGKILLed at
random moments (more than twenty times), on a simulated cluster whose API fails about one
request in five (429, 500, 503), drops exec streams before and after their command ran, and
restarts twice: once keeping its state, once losing every Kubernetes object (cordons, labels
and taints gone, as after an API server that lost its etcd; GPUs keep their power limits).
Alerts fire, repeat and resolve (some while their first steps still run) for thermal
(GPUTemperatureHigh/Critical), Xid 79 and uncorrectable ECC errors, with the shipped playbooks
in ``rules/`` and an operator approving drains through the API. Then, with faults off:

1. every delivery answered 200 is stored: the raw delivery, and an episode for every alert in
   it (resolved if the delivery resolved it);
2. every run is terminal, and every episode handled, within ``SETTLE_SECONDS``;
3. no effect is applied twice within one simulator state epoch (the simulator's mutation log:
   the same value written again while still in place, with no reverse in between);
4. for every run whose alert resolved and whose playbook says ``on_resolve: undo``, the final
   cluster state shows its effects undone (GPU power limit back at its default, node
   uncordoned), or the audit log has an ``effect.orphaned`` event (the reconciler's) reporting
   it;
5. the audit chain verifies (``remediator audit verify`` on the database, and the API);
6. every effect a run applied and its playbook never undoes (``on_resolve: continue``: the
   cordon, label and taint of Xid and ECC runs) is in the final cluster state, or the audit log
   has an ``effect.vanished`` (or ``effect.orphaned``) event reporting it (it disappeared with
   the simulator's objects).

A reporting event counts for a node when its data or reason names the node (or its run is on
the node) and, if it names GPUs at all, for a GPU when it names that GPU. The server runs its
reconciler every 2 seconds instead of every 5 minutes.

The storm is drawn from one seed (``REMEDIATOR_CHAOS_SEED``); failures name it.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from remediator.domain import runs as run_states
from remediator.sim import mutations
from tests.conftest import ROOT
from tests.e2e import chaos
from tests.e2e.procs import Serve

pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.timeout(220)]

ORPHANED = "effect.orphaned"
VANISHED = "effect.vanished"
SEED = int(os.environ.get("REMEDIATOR_CHAOS_SEED", "20261130"))
# The monkey's 22 kills take 22 x (uptime 0.9 s + restart 2.3 to 2.7 s on two cores, up to 4 s
# on a busy machine), plus the two simulator restarts and up to 20 s waiting for the Xid and ECC
# runs (longer since they evict the GPU's pods and climb the GPU's ladder) before the state loss.
STORM_LIMIT_SECONDS = 130.0
SETTLE_SECONDS = 40.0
ACTIVE = {status.value for status in run_states.RUN_ACTIVE}
ACTIONS_OF = {
    mutations.POWER_LIMIT: {"gpu.power_cap"},
    mutations.UNSCHEDULABLE: {"node.cordon", "node.uncordon", "node.drain"},
    mutations.LABEL: {"node.label", "node.unlabel"},
    mutations.TAINT: {"node.taint", "node.untaint"},
}


def serve_env(database_url: str, sim: chaos.SimProcess, workdir: pathlib.Path) -> dict[str, str]:
    return {
        "REMEDIATOR_DATABASE_URL": database_url,
        "REMEDIATOR_MIGRATE_ON_START": "true",
        "REMEDIATOR_RULES": str(ROOT / "rules"),
        "REMEDIATOR_ARTIFACT_DIR": str(workdir / "artifacts"),
        "REMEDIATOR_LOG_FORMAT": "text",
        "REMEDIATOR_POLL_INTERVAL": "0.1",
        "REMEDIATOR_LEASE_SECONDS": "2",
        # A restarted server takes the singleton loops (the lease sweeper) over from its killed
        # predecessor once the leader lease expires (Postgres): 3 s instead of 15.
        "REMEDIATOR_LEADER_LEASE_SECONDS": "3",
        "REMEDIATOR_KUBERNETES__MODE": "url",
        "REMEDIATOR_KUBERNETES__URL": sim.url,
        "REMEDIATOR_KUBERNETES__TOKEN": sim.token,
        # Guards that let every run proceed: the storm is about crashes, not budgets.
        "REMEDIATOR_GUARDS__MAX_NODES": "100",
        "REMEDIATOR_GUARDS__MAX_PERCENT": "100",
        "REMEDIATOR_GUARDS__MAX_DISRUPTIVE_RUNS": "100000",
        "REMEDIATOR_GUARDS__MAX_PER_NODE_PER_DAY": "100000",
        "REMEDIATOR_RECONCILE_INTERVAL": "2",
    }


def test_a_storm_with_crashes_and_api_faults_finishes_every_run_and_undoes_what_resolved(
    database_url: str, tmp_path: pathlib.Path
) -> None:
    sim = chaos.SimProcess(tmp_path)
    serve = Serve(env=serve_env(database_url, sim, tmp_path), log=tmp_path / "serve.log")
    storm = chaos.Storm(chaos.make_plan(SEED), sim=sim, serve=serve)
    try:
        sim.start()
        serve.start()
        busy = storm.run(STORM_LIMIT_SECONDS)
        start = time.monotonic()
        settled = settle(serve, start + SETTLE_SECONDS)
        storm.finish()
        outcome = observe(serve, sim, database_url, storm.acked, start + SETTLE_SECONDS)
        settle_seconds = time.monotonic() - start
    finally:
        storm.finish()
        serve.kill()
        sim.kill()
    problems = [f"the storm did not end within {STORM_LIMIT_SECONDS:g}s: {name}" for name in busy]
    problems += check_deliveries_stored(outcome, storm.refused)
    problems += check_runs_terminal(outcome, settled)
    problems += check_no_effect_applied_twice(outcome)
    problems += check_resolved_effects_undone_or_reported(outcome)
    problems += check_audit_chain(outcome)
    problems += check_kept_effects_present_or_reported(outcome, sim.restarts)
    summary = (
        f"seed {SEED} (rerun with REMEDIATOR_CHAOS_SEED={SEED}); {storm.summary()}; settle "
        f"{settle_seconds:.0f}s; runs by status "
        f"{dict(collections.Counter(r['status'] for r in outcome['runs'].values()))}; "
        f"{len(outcome['mutations'])} effect writes; {len(outcome['orphaned'])} {ORPHANED} "
        f"and {len(outcome['vanished'])} {VANISHED} events; logs in {tmp_path}"
    )
    print(summary)
    (tmp_path / "chaos-report.json").write_text(
        json.dumps({"summary": summary, "problems": problems, **outcome}, indent=1, default=str)
    )
    assert not problems, f"{summary}\n\n" + "\n\n".join(f"- {p}" for p in problems)


def test_the_storm_depends_only_on_its_seed_and_has_everything_the_issue_asks_for() -> None:
    plan = chaos.make_plan(SEED)
    assert chaos.make_plan(SEED) == plan
    assert chaos.make_plan(SEED + 1) != plan
    assert len(plan.uptimes) >= 20
    assert [keep for _, keep in plan.sim_restarts] == [True, False]
    lost_at = plan.sim_restarts[1][0]
    hardware = [e for e in plan.episodes if e.alertname in chaos.HARDWARE_ALERTS]
    assert all((e.starts - chaos.ORIGIN).total_seconds() < lost_at for e in hardware)
    statuses = collections.defaultdict(list)
    for delivery in plan.deliveries:
        statuses[delivery.episode].append((delivery.at, delivery.status))
    kinds = {episode.alertname for episode in statuses}
    assert kinds == set(chaos.TEMPLATES)
    for episode, seen in statuses.items():
        assert seen == sorted(seen), f"{episode.describe()} is delivered out of order"
        if episode.alertname in chaos.ALWAYS_RESOLVED:
            assert seen[-1][1] == "resolved", f"{episode.describe()} never resolves"
    firings = [seen for seen in statuses.values() if len([s for s in seen if s[1] == "firing"]) > 1]
    assert len(firings) >= 10, "repeats"
    quick = [
        seen
        for seen in statuses.values()
        if any(status == "resolved" and at - seen[0][0] < 1.5 for at, status in seen)
    ]
    assert len(quick) >= 10, "resolutions while the first steps run"
    assert len({(e.alertname, e.node, e.gpu) for e in statuses}) < len(statuses), "re-fires"


# ---- after the storm ---------------------------------------------------------------------


def settle(serve: Serve, deadline: float) -> bool:
    """Wait until no run is active and the engine has handled every episode's last status."""
    while True:
        try:
            active = [r for r in chaos.pages(serve.get, "/api/v1/runs") if r["status"] in ACTIVE]
            unhandled = [e for e in chaos.pages(serve.get, "/api/v1/alerts") if not e["handled"]]
            if not active and not unhandled:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def observe(
    serve: Serve,
    sim: chaos.SimProcess,
    database_url: str,
    acked: list[chaos.Acked],
    deadline: float,
) -> dict[str, Any]:
    """The outcome, once the cluster shows (or the audit log reports) what the runs left, or
    at the deadline: a reconciler may take a few seconds to notice lost effects."""
    while True:
        outcome = collect(serve, sim, database_url, acked)
        unsettled = check_resolved_effects_undone_or_reported(outcome)
        unsettled += check_kept_effects_present_or_reported(outcome, sim.restarts)
        if not unsettled or time.monotonic() > deadline:
            return outcome
        time.sleep(2)


def collect(
    serve: Serve, sim: chaos.SimProcess, database_url: str, acked: list[chaos.Acked]
) -> dict[str, Any]:
    runs = {
        r["id"]: serve.get(f"/api/v1/runs/{r['id']}")
        for r in chaos.pages(serve.get, "/api/v1/runs")
    }
    stored = {}
    for ack in acked:
        answer = httpx.get(f"{serve.url}/api/v1/deliveries/{ack.answer['deliveryId']}", timeout=10)
        stored[ack.answer["deliveryId"]] = answer.json() if answer.status_code == 200 else None
    verify = subprocess.run(
        [sys.executable, "-m", "remediator", "audit", "verify", "--database-url", database_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = sim.admin("GET", "/mutations")
    return {
        "acked": [
            {
                "delivery": a.answer,
                "status": a.delivery.status,
                "episode": a.delivery.episode.describe(),
                "body": a.body.decode(),
            }
            for a in acked
        ],
        "stored": stored,
        "episodes": chaos.pages(serve.get, "/api/v1/alerts"),
        "runs": runs,
        "orphaned": chaos.pages(serve.get, "/api/v1/audit/events", kind=ORPHANED),
        "vanished": chaos.pages(serve.get, "/api/v1/audit/events", kind=VANISHED),
        "verify_api": serve.get("/api/v1/audit/verify"),
        "verify_cli": {
            "code": verify.returncode,
            "out": verify.stdout,
            "err": verify.stderr[-2000:],
        },
        "cluster": sim.admin("GET", "/state"),
        "mutations": [*sim.lost_mutations, *log["entries"]],
        "epochs": list(dict.fromkeys(e["epoch"] for e in [*sim.lost_mutations, *log["entries"]])),
        "execs": [*sim.earlier_execs, *sim.admin("GET", "/execs")],
        "epoch": log["epoch"],
    }


def _describe_steps(run: dict[str, Any]) -> str:
    steps = []
    for step in run["steps"]:
        text = f"{step['key']}{' (undo)' if step['phase'] == 'undo' else ''} {step['status']}"
        text += f" attempt {step['attempt']}"
        if step["status"] == "running":
            text += f" lease {step['leaseOwner']} until {step['leaseExpiresAt']}"
        if step.get("error"):
            text += f" ({step['error'][:120]})"
        elif step["phase"] == "undo" and step.get("output"):
            text += f" (output {json.dumps(step['output'], sort_keys=True)[:160]})"
        steps.append(text)
    return "; ".join(steps)


def describe_run(run: dict[str, Any], runs: dict[int, dict[str, Any]] | None = None) -> str:
    alert = run.get("alert") or {}
    children = [
        f"#{c['id']} {c['kind']} {c['status']}"
        + (f" [{_describe_steps(runs[c['id']])}]" if runs and c["id"] in runs else "")
        for c in run.get("childRuns", [])
    ]
    return (
        f"run #{run['id']} {run['playbook']} ({run['kind']}) on {run['node']} GPU {run['gpu']}: "
        f"{run['status']}; alert episode #{alert.get('id')} {alert.get('alertname')} "
        f"{alert.get('status')} (startsAt {alert.get('startsAt')}, resolvedAt "
        f"{alert.get('resolvedAt')}); steps: {_describe_steps(run)}"
        + (f"; child runs: {', '.join(children)}" if children else "")
    )


def _moment(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_deliveries_stored(
    outcome: dict[str, Any], refused: list[tuple[chaos.Delivery, int, str]]
) -> list[str]:
    problems = [
        f"delivery of {d.episode.describe()} ({d.status}) was refused: {code} {text}"
        for d, code, text in refused
    ]
    episodes = {(e["fingerprint"], _moment(e["startsAt"])): e for e in outcome["episodes"]}
    for ack in outcome["acked"]:
        number = ack["delivery"]["deliveryId"]
        stored = outcome["stored"].get(number)
        if stored is None:
            problems.append(
                f"delivery #{number} ({ack['episode']}, {ack['status']}) was answered 200 "
                "but is not stored"
            )
            continue
        if json.loads(stored["body"]) != json.loads(ack["body"]):
            problems.append(f"delivery #{number} ({ack['episode']}) is stored with another body")
        for alert in json.loads(ack["body"])["alerts"]:
            episode = episodes.get((alert["fingerprint"], _moment(alert["startsAt"])))
            if episode is None:
                problems.append(
                    f"alert {ack['episode']} was answered 200 in delivery #{number} "
                    "but has no episode"
                )
            elif alert["status"] == "resolved" and episode["status"] != "resolved":
                problems.append(
                    f"alert {ack['episode']} was resolved by delivery #{number} (answered 200) "
                    f"but episode #{episode['id']} is {episode['status']}"
                )
    return problems


def check_runs_terminal(outcome: dict[str, Any], settled: bool) -> list[str]:
    if settled:
        return []
    problems = [
        f"not terminal {SETTLE_SECONDS:g}s after the storm: {describe_run(run)}"
        for run in outcome["runs"].values()
        if run["status"] in ACTIVE
    ]
    problems += [
        f"episode #{e['id']} {e['alertname']} {e['labels'].get('node')} ({e['status']}) was "
        f"never handled by the engine {SETTLE_SECONDS:g}s after the storm"
        for e in outcome["episodes"]
        if not e["handled"]
    ]
    return problems or [f"runs were still changing {SETTLE_SECONDS:g}s after the storm"]


def _writer(outcome: dict[str, Any], entry: dict[str, Any]) -> str:
    """The step most likely to have made a write: the last claim (``→ running``) before it of a
    step with a matching action on a run for that node (and GPU)."""
    claims = []
    when = _moment(entry["at"])
    for run in outcome["runs"].values():
        if run["node"] != entry["target"]:
            continue
        if entry["kind"] == mutations.POWER_LIMIT and run["gpu"] not in (None, entry["key"]):
            continue
        steps = {
            s["id"]: s for s in run["steps"] if s["action"] in ACTIONS_OF.get(entry["kind"], ())
        }
        for event in run["events"]:
            step = steps.get(event["stepId"])
            if step and event["toStatus"] == "running" and _moment(event["at"]) <= when:
                undo = " (undo)" if step["phase"] == "undo" else ""
                claims.append(
                    (
                        _moment(event["at"]),
                        f"run #{run['id']} {run['playbook']} step {step['key']}{undo}"
                        f", claimed at {event['at']}, now {step['status']}",
                    )
                )
    return max(claims)[1] if claims else "no step of a run on this target"


def _exec_note(outcome: dict[str, Any], entry: dict[str, Any]) -> str:
    """How the exec session that made ``entry`` ended, if an exec made it."""
    command = entry["source"].removeprefix("exec ").split(" in ")[0]
    sessions = [
        e for e in outcome["execs"] if " ".join(e["argv"]) == command and e["at"] <= entry["at"]
    ]
    if not sessions:
        return ""
    last = sessions[-1]
    if last["dropped"] == "after":
        return "; its exec stream was dropped after the command ran (injected fault)"
    return f"; its exec session ended with exit code {last['exit_code']}"


def _when(outcome: dict[str, Any], entry: dict[str, Any]) -> str:
    """Which simulator state (1: the first; a restart without state starts the next) and boot."""
    epoch = (
        outcome["epochs"].index(entry["epoch"]) + 1 if entry["epoch"] in outcome["epochs"] else 0
    )
    return f"state {epoch}, boot {entry['boot']}"


def check_no_effect_applied_twice(outcome: dict[str, Any]) -> list[str]:
    problems = []
    for first, again in mutations.repeated(outcome["mutations"]):
        field = f"{first['target']}{' ' + first['key'] if first['key'] else ''}"
        problems.append(
            f"{first['kind']} of {field} set to {first['after']!r} twice without a reverse: "
            f"first at {first['at']} ({_when(outcome, first)}, {first['source']}"
            f"{_exec_note(outcome, first)}), again at {again['at']} ({_when(outcome, again)}, "
            f"{again['source']}{_exec_note(outcome, again)}) while still {again['before']!r}; "
            f"last claimed before it: {_writer(outcome, again)}"
        )
    return problems


def _reported(
    outcome: dict[str, Any], node: str, gpu: str | None, kinds: tuple[str, ...] = ("orphaned",)
) -> bool:
    """A reporting event (of ``kinds``) names the node (in its data or through its run) and,
    when it names GPUs at all, this GPU."""
    for event in [e for kind in kinds for e in outcome[kind]]:
        run = outcome["runs"].get(event.get("runId")) or {}
        text = json.dumps(event.get("data")) + (event.get("reason") or "")
        on_node = node in text or run.get("node") == node
        on_gpu = gpu is None or gpu in text or run.get("gpu") == gpu or "GPU-" not in text
        if on_node and on_gpu:
            return True
    return False


def check_resolved_effects_undone_or_reported(outcome: dict[str, Any]) -> list[str]:
    runs = outcome["runs"].values()
    undoing = [
        r
        for r in runs
        if r["kind"] == "alert"
        and r["onResolve"] == "undo"
        and (r.get("alert") or {}).get("status") == "resolved"
    ]
    held = {
        r["node"]
        for r in runs
        if r["onResolve"] != "undo"
        and any(s["action"] == "node.cordon" and s["status"] == "succeeded" for s in r["steps"])
    }
    gpus = {
        (node, g["uuid"]): g for node, items in outcome["cluster"]["gpus"].items() for g in items
    }
    nodes = {n["metadata"]["name"]: n for n in outcome["cluster"]["nodes"]}
    capped: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    cordoned: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for run in undoing:
        actions = {s["action"] for s in run["steps"] if s["phase"] == "do"}
        gpu = gpus.get((run["node"], run["gpu"]))
        if (
            "gpu.power_cap" in actions
            and gpu
            and abs(gpu["power_limit"] - gpu["default_limit"]) > 0.5
        ):
            capped[(run["node"], run["gpu"])].append(run)
        node = nodes.get(run["node"]) or {}
        if (
            "node.cordon" in actions
            and run["node"] not in held
            and node.get("spec", {}).get("unschedulable")
        ):
            cordoned[run["node"]].append(run)
    problems = []
    for (node_name, uuid), owners in sorted(capped.items()):
        if _reported(outcome, node_name, uuid):
            continue
        gpu = gpus[(node_name, uuid)]
        writes = [
            f"{e['before']}->{e['after']} at {e['at']} ({_when(outcome, e)})"
            for e in outcome["mutations"]
            if e["kind"] == mutations.POWER_LIMIT and e["key"] == uuid
        ]
        problems.append(
            f"GPU {uuid} (index {gpu['index']}) on {node_name} is left capped at "
            f"{gpu['power_limit']:g} W (default {gpu['default_limit']:g} W) after its alerts "
            f"resolved with on_resolve: undo, and no {ORPHANED} event reports it. "
            f"Power-limit writes: {writes}. Runs: "
            + " | ".join(describe_run(r, outcome["runs"]) for r in owners)
        )
    for node_name, owners in sorted(cordoned.items()):
        if _reported(outcome, node_name, None):
            continue
        holder = (nodes[node_name]["metadata"].get("annotations") or {}).get(
            "remediator.io/cordoned-by"
        )
        problems.append(
            f"node {node_name} is left cordoned (cordoned-by {holder}) after its alerts resolved "
            f"with on_resolve: undo, and no {ORPHANED} event reports it. Runs: "
            + " | ".join(describe_run(r, outcome["runs"]) for r in owners)
        )
    return problems


def check_audit_chain(outcome: dict[str, Any]) -> list[str]:
    problems = []
    if not outcome["verify_api"].get("ok"):
        problems.append(f"GET /api/v1/audit/verify: {outcome['verify_api']}")
    cli = outcome["verify_cli"]
    if cli["code"] != 0:
        problems.append(f"remediator audit verify exited {cli['code']}: {cli['out']} {cli['err']}")
    return problems


def _missing_effects(run: dict[str, Any], node: dict[str, Any]) -> list[tuple[str, str]]:
    """(effect, by whom) for what ``run``'s succeeded cordon, label and taint steps set that
    ``node`` no longer has."""
    labels = node["metadata"].get("labels") or {}
    taints = {(t.get("key"), t.get("effect")) for t in node["spec"].get("taints") or []}
    missing = []
    for step in run["steps"]:
        if step["phase"] != "do" or step["status"] != "succeeded":
            continue
        by = f"run #{run['id']} {run['playbook']}"
        if step["action"] == "node.cordon" and not node["spec"].get("unschedulable"):
            missing.append(("cordon", by))
        if step["action"] == "node.label":
            for key, value in (step["params"].get("labels") or {}).items():
                if labels.get(key) != value:
                    missing.append((f"label {key}={value} (now {labels.get(key)!r})", by))
        if step["action"] == "node.taint":
            for taint in step["params"].get("taints") or []:
                if (taint.get("key"), taint.get("effect")) not in taints:
                    missing.append((f"taint {taint.get('key')}:{taint.get('effect')}", by))
    return missing


def check_kept_effects_present_or_reported(
    outcome: dict[str, Any], restarts: list[str]
) -> list[str]:
    nodes = {n["metadata"]["name"]: n for n in outcome["cluster"]["nodes"]}
    missing: dict[str, dict[str, list[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for run in outcome["runs"].values():
        if run["onResolve"] == "continue" and run["node"] in nodes:
            for effect, by in _missing_effects(run, nodes[run["node"]]):
                missing[run["node"]][effect].append(by)
    return [
        f"node {node} no longer has effects that runs applied and never undo (on_resolve: "
        f"continue), and no {VANISHED} or {ORPHANED} event reports them: "
        + "; ".join(f"{effect} (applied by {', '.join(by)})" for effect, by in effects.items())
        + f" (the simulator {', '.join(restarts) or 'never restarted'})"
        for node, effects in sorted(missing.items())
        if not _reported(outcome, node, None, ("vanished", "orphaned"))
    ]
