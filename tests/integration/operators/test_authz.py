"""Every endpoint x every role (and no token, a wrong token): exactly the expected allow/deny."""

from __future__ import annotations

import pytest

from remediator.adapters.http import openapi
from tests.integration.operators.conftest import BY_ROLE, GATED, MANUAL, alert_body, bearer

READ = {"operator", "auditor", "admin"}
OPERATE = {"operator", "admin"}
AUDIT = {"auditor", "admin"}
PUBLIC = {"ingest", "operator", "auditor", "admin", None, "wrong"}

# (method, path as registered, concrete path, JSON body, roles allowed)
MATRIX = [
    ("POST", "/api/v1/alerts", "/api/v1/alerts", "alert", {"ingest", "admin"}),
    ("GET", "/api/v1/alerts", "/api/v1/alerts", None, READ),
    ("GET", "/api/v1/runs", "/api/v1/runs", None, READ),
    ("GET", "/api/v1/runs/{run_id}", "/api/v1/runs/1", None, READ),
    ("GET", "/api/v1/runs/{run_id}/plan", "/api/v1/runs/1/plan", None, READ),
    ("POST", "/api/v1/plan", "/api/v1/plan", {}, READ),
    (
        "POST",
        "/api/v1/runs/{run_id}/steps/{step_id}/approve",
        "/api/v1/runs/1/steps/999/approve",
        {"comment": "x"},
        OPERATE,
    ),
    (
        "POST",
        "/api/v1/runs/{run_id}/steps/{step_id}/reject",
        "/api/v1/runs/1/steps/999/reject",
        {"comment": "x"},
        OPERATE,
    ),
    ("GET", "/api/v1/approvals", "/api/v1/approvals", None, READ),
    ("GET", "/api/v1/runbooks", "/api/v1/runbooks", None, READ),
    (
        "POST",
        "/api/v1/runbooks/{playbook}/runs",
        "/api/v1/runbooks/return-to-service/runs",
        {"node": "n1", "params": {}},
        OPERATE,
    ),
    ("GET", "/api/v1/fleet", "/api/v1/fleet", None, READ),
    ("GET", "/api/v1/breaker", "/api/v1/breaker", None, READ),
    ("POST", "/api/v1/breaker/reset", "/api/v1/breaker/reset", {"comment": "x"}, OPERATE),
    ("GET", "/api/v1/audit/events", "/api/v1/audit/events", None, AUDIT),
    ("GET", "/api/v1/audit/runs", "/api/v1/audit/runs", None, AUDIT),
    ("GET", "/api/v1/audit/export", "/api/v1/audit/export", None, AUDIT),
    ("GET", "/api/v1/audit/verify", "/api/v1/audit/verify", None, AUDIT),
    ("GET", "/api/v1/deliveries/{delivery_id}", "/api/v1/deliveries/1", None, AUDIT),
    ("GET", "/api/v1/artifacts/{path}", "/api/v1/artifacts/x/y.gz", None, AUDIT),
    ("GET", "/api/v1/openapi.json", "/api/v1/openapi.json", None, PUBLIC),
    ("GET", "/healthz", "/healthz", None, PUBLIC),
    ("GET", "/readyz", "/readyz", None, PUBLIC),
    ("GET", "/metrics", "/metrics", None, PUBLIC),
    ("GET", "/runbooks", "/runbooks", None, READ),
    ("GET", "/runbooks/runs/{run_id}", "/runbooks/runs/1", None, READ),
    ("GET", "/runbooks/fleet", "/runbooks/fleet", None, READ),
    ("GET", "/runbooks/runs", "/runbooks/runs", None, READ),
    ("GET", "/runbooks/audit", "/runbooks/audit", None, AUDIT),
    ("GET", "/runbooks/login", "/runbooks/login", None, PUBLIC),
    ("GET", "/", "/", None, PUBLIC),  # a redirect to /runbooks, which checks the caller
]
# Form posts need a CSRF token first; test_identity covers them role by role.
FORMS = {
    ("POST", "/runbooks/login"),
    ("POST", "/runbooks/logout"),
    ("POST", "/runbooks/runs/{run_id}/steps/{step_id}/approve"),
    ("POST", "/runbooks/runs/{run_id}/steps/{step_id}/reject"),
    ("POST", "/runbooks/{playbook}/trigger"),
    ("POST", "/runbooks/breaker/reset"),
}
CALLERS = ["ingest", "operator", "auditor", "admin", None, "wrong"]


def _headers(caller):
    if caller is None:
        return {}
    if caller == "wrong":
        return {"Authorization": "Bearer not-a-known-token-at-all"}
    return bearer(BY_ROLE[caller])


async def test_every_endpoint_answers_each_role_exactly_as_expected(make_harness, tokens_path):
    # Every endpoint gets a wrong token: lift the throttle (test_sign_in covers it).
    h = await make_harness(GATED, MANUAL, tokens=tokens_path, auth_failure_limit=1000)
    await h.post(alert_body(), **bearer("alertmanager"))
    await h.settle()
    app = h.client.server.app
    registered = set(openapi.registered_routes(app))
    assert registered == {(m, p) for m, p, *_ in MATRIX} | FORMS
    problems = []
    for method, template, path, body, allowed in MATRIX:
        doc_roles = openapi.OPERATIONS[(method, template)].roles
        if allowed is not PUBLIC:
            assert set(doc_roles or ()) == allowed, template
        for caller in CALLERS:
            kwargs = {"headers": _headers(caller), "allow_redirects": False}
            if body == "alert":
                kwargs["data"] = alert_body(node="gpu-node-09")
                kwargs["headers"]["Content-Type"] = "application/json"
            elif body is not None:
                kwargs["json"] = body
            response = await h.client.request(method, path, **kwargs)
            await response.read()
            denied = response.status in (401, 403) or (
                template.startswith("/runbooks") and response.status == 303
            )
            expected_denied = caller not in allowed
            if denied != expected_denied:
                problems.append(f"{method} {path} as {caller}: {response.status}")
            stranger = caller in (None, "wrong") and not template.startswith("/run")
            if expected_denied and stranger and response.status != 401:
                problems.append(f"{method} {path} as {caller}: {response.status} not 401")
    assert problems == []


@pytest.mark.parametrize("caller", ["operator", "auditor", "admin"])
async def test_pages_redirect_strangers_to_sign_in(make_harness, tokens_path, caller):
    h = await make_harness(GATED, tokens=tokens_path)
    stranger = await h.client.get("/runbooks", allow_redirects=False)
    assert stranger.status == 303
    assert stranger.headers["Location"] == "/runbooks/login"
    signed = await h.client.get("/runbooks", headers=_headers(caller))
    assert signed.status == 200
