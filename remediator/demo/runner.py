"""Play the scenario: post each act's deliveries as Alertmanager would, follow the runs they
start through the API (steps, approvals, drain progress), check the cluster, then show the
audit trail and its verification."""

from __future__ import annotations

import asyncio
import pathlib
import shlex
import sys
from typing import Any

import httpx

from remediator.demo import acts, checks, display, processes

ACT_TIMEOUT = 45.0
"""How long an act may take (``--act-timeout``); time a step waits for you does not count."""
NO_RUN_TIMEOUT = 10.0
POLL = 0.2
ACTIVE = {"pending", "running", "waiting_approval"}
BAD_ENDINGS = {"failed", "rejected", "cancelled"}
TOLD = {"succeeded", "failed", "skipped", "cancelled", "rejected", "waiting_approval"}


class Api:
    """The server's HTTP API with the demo's three tokens."""

    def __init__(self, client: httpx.AsyncClient, tokens: processes.Tokens) -> None:
        self.client = client
        self.tokens = tokens

    async def call(self, method: str, path: str, token: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        response = await self.client.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 300:
            raise processes.DemoError(
                f"{method} {path} answered {response.status_code}: {response.text}"
            )
        return response.json()

    async def post_alerts(self, body: bytes) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        return dict(
            await self.call(
                "POST", "/api/v1/alerts", self.tokens.ingest, content=body, headers=headers
            )
        )

    async def runs(self) -> list[dict[str, Any]]:
        page = await self.call("GET", "/api/v1/runs", self.tokens.operator, params={"limit": 200})
        return sorted(page["items"], key=lambda run: run["id"])

    async def run(self, run_id: int) -> dict[str, Any]:
        return dict(await self.call("GET", f"/api/v1/runs/{run_id}", self.tokens.operator))

    async def approve(self, run_id: int, step_id: int, comment: str) -> dict[str, Any]:
        path = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
        return dict(await self.call("POST", path, self.tokens.operator, json={"comment": comment}))

    async def verify(self) -> dict[str, Any] | None:
        response = await self.client.get(
            "/api/v1/audit/verify", headers={"Authorization": f"Bearer {self.tokens.auditor}"}
        )
        return dict(response.json()) if response.status_code == 200 else None


class Player:
    def __init__(
        self,
        *,
        show: display.Display,
        api: Api,
        sim: processes.Sim,
        server: processes.Server,
        interactive: bool,
        act_timeout: float = ACT_TIMEOUT,
    ) -> None:
        self.show = show
        self.api = api
        self.sim = sim
        self.server = server
        self.interactive = interactive
        self.act_timeout = act_timeout
        self.announced: set[int] = set()
        self.told: set[tuple[int, str]] = set()
        self.updated: dict[int, str] = {}
        self.finished: dict[int, str] = {}
        self.approved: set[int] = set()
        self.decisions: set[tuple[int, str]] = set()
        self.details: dict[int, dict[str, Any]] = {}
        self.deliveries = 0

    async def play(self, number: int, act: acts.Act) -> None:
        self.show.act(number, act.title, act.story)
        baseline = max(self.updated, default=0)
        for change in act.hardware:
            gpu = self.sim.cluster.gpu(change.node, change.gpu)
            if gpu is None:
                raise processes.DemoError(f"the simulator has no GPU {change.gpu} on {change.node}")
            for key, value in change.state.items():
                setattr(gpu, key, value)
            state = ", ".join(f"{k}={v}" for k, v in change.state.items())
            self.show.event(
                "⚙", f"hardware: {change.node} GPU {change.gpu} {state}", color="magenta"
            )
        for name in act.deliveries:
            body = acts.delivery_body(name)
            summary = display.alert_line(_json(body))
            self.show.event("⇢", f"Alertmanager delivers {name}", color="magenta")
            self.show.line(f"  {self.show.style(summary, 'bold')}", indent=9)
            answer = await self.api.post_alerts(body)
            self.deliveries += 1
            self.show.line(f"  → {display.intake_line(answer)}", indent=9)
        await self._follow(number, act, baseline)

    async def _follow(self, number: int, act: acts.Act, baseline: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.act_timeout
        no_run_deadline = loop.time() + NO_RUN_TIMEOUT
        while True:
            waiting = await self._poll(act, baseline)
            results = self._evaluate(act)
            new = [r for r in self.details.values() if r["id"] > baseline and r["kind"] == "alert"]
            started = {pb: sum(r["playbook"] == pb for r in new) for pb in act.new_runs}
            quiet = not any(_active(detail) for detail in self.details.values())
            if quiet and started == act.new_runs and all(ok for _, ok, _ in results):
                break
            if quiet and loop.time() > no_run_deadline:
                _require_started(number, act, started)
            if waiting and self.interactive:  # yours to decide: as long as you like
                deadline = loop.time() + self.act_timeout
            if loop.time() > deadline:
                for want, ok, found in results:
                    self.show.check(ok, want.describe(), found)
                if started != act.new_runs:
                    self.show.check(False, f"runs started {act.new_runs}", f"got {started}")
                raise processes.DemoError(
                    f"act {number} ({act.title}) did not end as expected within "
                    f"{self.act_timeout:g} s (see the ✗ above); the server's last log lines:\n"
                    f"{self.server.tail(15)}"
                )
            await asyncio.sleep(POLL)
        extra = {pb: n for pb, n in _count(new).items() if n != act.new_runs.get(pb, 0)}
        if extra:
            raise processes.DemoError(f"act {number} started unexpected runs: {extra}")
        for want, ok, found in results:
            self.show.check(ok, want.describe(), found)

    def _evaluate(self, act: acts.Act) -> list[tuple[acts.Expectation, bool, str]]:
        details = list(self.details.values())
        found = []
        for want in act.expect:
            ok, text = checks.evaluate(
                want, cluster=self.sim.cluster, details=details, artifacts=self.server.artifacts
            )
            found.append((want, ok, text))
        return found

    async def _poll(self, act: acts.Act, baseline: int) -> bool:
        """Refresh every run that changed; tell new steps; approve; show drain progress.
        True while a step of any run waits for an operator."""
        for run in await self.api.runs():
            known = self.details.get(run["id"])
            if known and self.updated[run["id"]] == run["updatedAt"] and not _active(known):
                continue
            self.updated[run["id"]] = run["updatedAt"]
            detail = await self.api.run(run["id"])
            self.details[run["id"]] = detail
            if run["id"] not in self.announced:
                self.announced.add(run["id"])
                self.show.event("▶", self.show.style(display.run_line(detail), "bold"), indent=4)
            await self._tell(act, detail)
        return any(
            step["status"] == "waiting_approval"
            for detail in self.details.values()
            for step in detail["steps"]
        )

    async def _tell(self, act: acts.Act, detail: dict[str, Any]) -> None:
        for step in detail["steps"]:
            status = step["status"]
            draining = step["action"] in ("node.drain", "gpu.drain_workloads")
            if status == "running" and draining and step.get("output"):
                self.show.progress(display.progress_line(step["output"]))
            if status not in TOLD or (step["id"], status) in self.told:
                continue
            self.told.add((step["id"], status))
            self.show.step(detail["id"], step)
            if status == "waiting_approval":
                await self._approval(act, detail, step)
        for approval in detail.get("approvals") or [] if self.interactive else []:
            if (approval["stepId"], approval["principal"]) not in self.decisions:
                self.decisions.add((approval["stepId"], approval["principal"]))
                text = f"{approval['decision']} by {approval['principal']}: “{approval['comment']}”"
                self.show.event("✓", text, color="green", indent=6)
        if detail["status"] not in ACTIVE and self.finished.get(detail["id"]) != detail["status"]:
            self.finished[detail["id"]] = detail["status"]
            self._outcome(detail)

    def _outcome(self, detail: dict[str, Any]) -> None:
        status = detail["status"]
        _, color = display.STATUS_MARKS.get(status, ("?", "dim"))
        text = f"run #{detail['id']} {detail['playbook']} {status}"
        self.show.event("■", self.show.style(text, color, "bold"), color=color, indent=4)
        if status in BAD_ENDINGS:
            errors = [f"{s['key']}: {s.get('error')}" for s in detail["steps"] if s.get("error")]
            raise processes.DemoError(
                f"run #{detail['id']} ({detail['playbook']}) ended {status}: "
                f"{'; '.join(errors) or detail.get('reason')}"
            )

    async def _approval(self, act: acts.Act, detail: dict[str, Any], step: dict[str, Any]) -> None:
        run_id, step_id = detail["id"], step["id"]
        if step["key"] not in act.approve:
            raise processes.DemoError(
                f"run #{run_id} waits for approval of {step['key']}, unexpected"
            )
        path = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
        if self.interactive:
            self._prompt(run_id, step, path)
            return
        if step_id in self.approved:
            return
        comment = (
            f"Demo operator: {detail.get('node')} is cordoned and tainted; "
            f"its workloads may move now."
        )
        await self.api.approve(run_id, step_id, comment)
        self.approved.add(step_id)
        self.show.event(
            "✓",
            f"approved by demo-operator: POST {path} “{comment}”",
            color="green",
            indent=6,
        )

    def _prompt(self, run_id: int, step: dict[str, Any], path: str) -> None:
        server, token = self.server.url, self.api.tokens.operator
        page = f"{server}/runbooks/runs/{run_id}"
        cli = (
            f"{command_prefix()} runs approve {run_id} {step['id']} --server {server} "
            f"--token {shlex.quote(token)} --comment 'looks right'"
        )
        curl = (
            f"curl -s -X POST -H {shlex.quote('Authorization: Bearer ' + token)}"
            f" -H 'Content-Type: application/json' --data '{{\"comment\": \"looks right\"}}' "
            f"{server}{path}"
        )
        lines = [
            self.show.style(
                f"Your turn: approve (or reject) step {step['key']} of run #{run_id}.",
                "yellow",
                "bold",
            ),
            f"console:  {page}  (sign in with the operator token below)",
            f"CLI:      {cli}",
            "          (runs reject … to refuse it)",
            f"API:      {curl}",
            f"operator token: {token}",
            "waiting for your decision, as long as you like… (Ctrl-C stops the demo)",
        ]
        for line in lines:
            self.show.line(line, indent=8)

    async def audit(self) -> bool:
        self.show.heading("Audit trail (GET /api/v1/runs/{id}: every transition, hash-chained)")
        for run_id in sorted(self.details):
            detail = await self.api.run(run_id)
            self.show.line(self.show.style(display.run_line(detail), "bold"), indent=2)
            for approval in detail.get("approvals") or []:
                self.show.line(
                    f"approval: {approval['decision']} by {approval['principal']} "
                    f"at {str(approval['at'])[11:19]}: “{approval['comment']}”",
                    indent=4,
                )
            events = detail.get("events") or []
            for event in events:
                if not display.attempt_start(event):
                    self.show.line(self.show.style(display.event_line(event), "dim"), indent=4)
            hidden = sum(display.attempt_start(event) for event in events)
            if hidden:
                self.show.line(
                    self.show.style(f"(+ {hidden} attempt-start events, pending → running)", "dim"),
                    indent=4,
                )
        report = await self.api.verify()
        if report is None:
            self.show.line("(this server has no GET /api/v1/audit/verify)", indent=2)
            return True
        ok = bool(report.get("ok"))
        self.show.check(
            ok, f"GET /api/v1/audit/verify as demo-auditor: {display.verify_line(report)}"
        )
        return ok


def command_prefix() -> str:
    """How to run ``remediator`` the way this demo was started (its script, else ``-m``)."""
    script = pathlib.Path(sys.argv[0])
    if script.name == "remediator":
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m remediator"


def _json(body: bytes) -> dict[str, Any]:
    import json

    value = json.loads(body)
    return value if isinstance(value, dict) else {}


def _require_started(number: int, act: acts.Act, started: dict[str, int]) -> None:
    missing = sorted(pb for pb, n in act.new_runs.items() if started.get(pb, 0) < n)
    if missing:
        raise processes.DemoError(
            f"act {number} ({act.title}): no run of {', '.join(missing)} started within "
            f"{NO_RUN_TIMEOUT:g} s of the delivery; are those playbooks in the rules directory?"
        )


def _active(detail: dict[str, Any]) -> bool:
    return detail["status"] in ACTIVE or any(
        s["status"] in ("pending", "running") for s in detail["steps"]
    )


def _count(runs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in runs:
        counts[run["playbook"]] = counts.get(run["playbook"], 0) + 1
    return counts
