"""The OpenAPI document covers exactly the registered routes; schemathesis finds no 5xx."""

from __future__ import annotations

import pytest

from remediator.adapters.http import openapi
from tests.e2e import procs
from tests.integration.conftest import write_playbooks
from tests.integration.operators.conftest import GATED, MANUAL


async def test_every_registered_route_is_documented_and_nothing_else(make_harness):
    h = await make_harness(GATED)
    response = await h.client.get("/api/v1/openapi.json")
    assert response.status == 200
    document = await response.json()
    assert document["openapi"] == "3.1.0"
    documented = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    registered = set(openapi.registered_routes(h.client.server.app))
    assert registered - documented == set(), "routes without documentation"
    assert documented - registered == set(), "documentation without routes"
    trigger = document["paths"]["/api/v1/runbooks/{playbook}/runs"]["post"]
    schema = trigger["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["properties"]) >= {"node", "params"}


async def test_the_document_states_error_statuses_id_patterns_and_the_limit_bounds(make_harness):
    h = await make_harness(GATED)
    document = await (await h.client.get("/api/v1/openapi.json")).json()
    paths = document["paths"]
    reset = paths["/api/v1/breaker/reset"]["post"]["responses"]
    assert {"400", "403", "408", "413", "415", "421"} <= set(reset)
    intake = paths["/api/v1/alerts"]["post"]["responses"]
    assert {"400", "408", "413", "415"} <= set(intake)
    login = paths["/runbooks/login"]["post"]["responses"]
    assert {"403", "408", "413", "415"} <= set(login)
    assert "415" not in paths["/api/v1/runs"]["get"]["responses"]
    [limit] = [p for p in paths["/api/v1/runs"]["get"]["parameters"] if p["name"] == "limit"]
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)
    [run_id] = paths["/api/v1/runs/{run_id}"]["get"]["parameters"]
    assert run_id["schema"]["pattern"] == "^[0-9]{1,19}$"


@pytest.fixture
def live_server(tmp_path):
    """A real ``remediator serve`` on 127.0.0.1 (SQLite, no tokens: the loopback admin)."""
    env = {
        "REMEDIATOR_PLUGINS": '["tests.support.recording"]',
        "REMEDIATOR_TEST_RECORD": str(tmp_path / "records.jsonl"),
        "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
        "REMEDIATOR_RULES": str(write_playbooks(tmp_path / "rules", GATED, MANUAL)),
        "REMEDIATOR_ARTIFACT_DIR": str(tmp_path / "artifacts"),
    }
    server = procs.Serve(env=env, log=tmp_path / "serve.log").start()
    try:
        yield server.url
    finally:
        server.terminate()


@pytest.mark.timeout(300)
def test_schemathesis_finds_no_server_errors(live_server):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings

    schema = schemathesis.openapi.from_url(f"{live_server}/api/v1/openapi.json")
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=5,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call()
            if response.status_code >= 500:
                failures.append(f"{case.operation.label}: {response.status_code}")

        check()
    assert failures == []
