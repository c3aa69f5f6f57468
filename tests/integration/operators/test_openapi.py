"""The OpenAPI document covers exactly the registered routes; schemathesis with all its checks
finds nothing against a live server."""

from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

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


# The server answers 413 to a body above its size limit (max_body_bytes), which JSON Schema
# cannot state: a schema-valid body can be too large (10,000 alerts of the webhook schema), and
# an invalid one too large to read is refused with 413 as well. The document lists 413 on every
# operation that takes a body; these lists are schemathesis' defaults plus 413.
SCHEMATHESIS_CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", 401, 403, 404, 409, 413, 429, "5xx"]

[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]
"""
ADMIN_TOKEN = "schemathesis-admin-token-0123456789"


@pytest.fixture
def live_server(tmp_path, database_url):
    """A real ``remediator serve`` on 127.0.0.1 with a tokens file, on each database backend
    (Postgres refuses what SQLite takes: NUL characters in text). Wrong tokens are throttled
    only past a million failures: schemathesis sends invalid credentials on purpose (to check
    they are refused with 401) far more often than five times a minute."""
    tokens = tmp_path / "tokens.yaml"
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    tokens.write_text(
        yaml.safe_dump([{"name": "root", "token_sha256": digest, "roles": ["admin"]}])
    )
    env = {
        "REMEDIATOR_PLUGINS": '["tests.support.recording"]',
        "REMEDIATOR_TEST_RECORD": str(tmp_path / "records.jsonl"),
        "REMEDIATOR_DATABASE_URL": database_url,
        "REMEDIATOR_RULES": str(write_playbooks(tmp_path / "rules", GATED, MANUAL)),
        "REMEDIATOR_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "REMEDIATOR_TOKENS": str(tokens),
        "REMEDIATOR_AUTH_FAILURE_LIMIT": "1000000",
        "REMEDIATOR_MIGRATE_ON_START": "true",
    }
    server = procs.Serve(env=env, log=tmp_path / "serve.log").start()
    try:
        yield server
    finally:
        server.terminate()


@pytest.mark.timeout(300)
def test_schemathesis_with_every_check_finds_nothing(live_server, tmp_path):
    """``schemathesis run --checks all`` as an admin: every status, content type, header and
    body conforms to the document, schema-valid requests are accepted and invalid ones refused,
    authentication is enforced, other methods get 405 with Allow. Coverage, fuzzing and
    stateful phases, fixed seed, about a minute and a half on two busy cores."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        str(pathlib.Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(config),
        "run",
        f"{live_server.url}/api/v1/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        "--max-examples",
        "10",
        "--seed",
        "1",
        "--workers",  # two workers share two cores, and race in hypothesis' lambda parsing
        "1",
        "--generation-database",
        "none",
        "--no-color",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=280, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20_000:] + "\n--- server log ---\n" + live_server.tail()
    operations = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", output)
    assert operations is not None, output[-5_000:]
    assert operations[1] == operations[2] == operations[3], "every operation is tested"
    cases = re.search(r"(\d+) generated, (\d+) passed", output)
    assert cases is not None, output[-5_000:]
    assert int(cases[1]) == int(cases[2]) > 500
