"""Every JSON answer of ``/api/v1`` names its keys in camelCase, as Alertmanager's API does.
Free-form payloads (a step's params and output, a plan step's preview, an event's data and
sealed rows, alert labels and annotations) are the playbooks', the actions' and Alertmanager's
data: their keys are kept as written and not checked."""

from __future__ import annotations

import json
import re

from tests.integration.operators.conftest import GATED, MANUAL, alert_body, bearer, waiting_step

CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$|^(generatorURL|alertmanagerURL)$")
FREE_FORM = frozenset({"params", "output", "preview", "data", "rows", "labels", "annotations"})
# Maps whose keys are names from a playbook (its parameters); their values are the API's.
NAMED_BY_PLAYBOOK = frozenset({"parameters"})
SNAKE_PARAMS = """
name: snake-params
manual: true
parameters:
  change_ticket: {type: string, required: true}
steps:
  - {id: note, action: test.record, params: {label: "{{ params.change_ticket }}"}}
"""


def not_camel(value, path="$"):
    """Paths of keys that are not camelCase, outside free-form payloads."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}"
            if not CAMEL.fullmatch(key):
                found.append(here)
            if key in NAMED_BY_PLAYBOOK and isinstance(item, dict):
                for name, spec in item.items():
                    found += not_camel(spec, f"{here}.{name}")
            elif key not in FREE_FORM:
                found += not_camel(item, here)
    elif isinstance(value, list):
        for item in value:
            found += not_camel(item, f"{path}[]")
    return found


async def _answers(h, headers):
    """Every API answer with data in it: the webhook's, plans, a decision, a trigger, a
    breaker reset, and every GET."""
    answers = {}
    intake = await h.post(alert_body(), **bearer("alertmanager"))
    answers["POST /api/v1/alerts"] = await intake.json()
    await h.settle()
    run_id, step_id = await waiting_step(h, headers)
    other = alert_body(node="gpu-node-04", fingerprint="00000000000000ab")
    planned = await h.client.post(
        "/api/v1/plan", data=other, headers={**headers, "Content-Type": "application/json"}
    )
    answers["POST /api/v1/plan"] = await planned.json()
    assert answers["POST /api/v1/plan"]["alerts"][0]["playbooks"][0]["steps"]
    runs = [f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/plan", "/api/v1/approvals"]
    for path in runs:  # while a step waits
        answers[f"GET {path} (waiting)"] = await (await h.client.get(path, headers=headers)).json()
    decided = await h.client.post(
        f"/api/v1/runs/{run_id}/steps/{step_id}/approve", json={"comment": "go"}, headers=headers
    )
    answers["POST approve"] = await decided.json()
    triggered = await h.client.post(
        "/api/v1/runbooks/return-to-service/runs",
        json={"node": "gpu-node-07", "params": {"reason": "fixed"}},
        headers=headers,
    )
    answers["POST /api/v1/runbooks/{playbook}/runs"] = await triggered.json()
    reset = await h.client.post("/api/v1/breaker/reset", json={"comment": "ok"}, headers=headers)
    answers["POST /api/v1/breaker/reset"] = await reset.json()
    await h.settle()
    detail = await (await h.client.get(f"/api/v1/runs/{run_id}", headers=headers)).json()
    for path in (
        "/api/v1/alerts",
        "/api/v1/runs",
        f"/api/v1/runs/{run_id}",
        "/api/v1/runbooks",
        "/api/v1/breaker",
        "/api/v1/fleet",
        "/api/v1/audit/events",
        "/api/v1/audit/runs",
        "/api/v1/audit/verify",
        f"/api/v1/deliveries/{detail['alert']['firstDeliveryId']}",
        "/api/v1/runs/999999",
    ):
        response = await h.client.get(path, headers=headers)
        answers[f"GET {path}"] = await response.json()
    export = await h.client.get("/api/v1/audit/export", headers=headers)
    lines = [json.loads(line) for line in (await export.text()).splitlines()]
    answers["GET /api/v1/audit/export"] = lines
    return answers


async def test_every_api_answer_names_its_keys_in_camel_case(make_harness, tokens_path):
    h = await make_harness(GATED, MANUAL, SNAKE_PARAMS, tokens=tokens_path)
    answers = await _answers(h, bearer("root"))
    assert answers["GET /api/v1/audit/events"]["items"], "events to check"
    assert answers["GET /api/v1/approvals (waiting)"]["items"], "approvals to check"
    runbook = next(
        r for r in answers["GET /api/v1/runbooks"]["items"] if r["name"] == "snake-params"
    )
    assert "change_ticket" in runbook["parameters"], "a playbook's own names are kept"
    problems = {name: sorted(set(not_camel(answer))) for name, answer in answers.items()}
    assert {name: paths for name, paths in problems.items() if paths} == {}


async def test_free_form_payloads_keep_their_keys(make_harness, tokens_path):
    h = await make_harness(GATED, tokens=tokens_path)
    await h.post(alert_body(extra_labels={"gpu_model": "H100"}), **bearer("alertmanager"))
    await h.settle()
    [run] = (await (await h.client.get("/api/v1/runs", headers=bearer("root"))).json())["items"]
    detail = await (await h.client.get(f"/api/v1/runs/{run['id']}", headers=bearer("root"))).json()
    assert detail["alert"]["labels"]["gpu_model"] == "H100"
    created = next(e for e in detail["events"] if e["kind"] == "run.created")
    assert {"runId", "prevHash", "toStatus"} <= set(created)
    assert "run_id" not in created
