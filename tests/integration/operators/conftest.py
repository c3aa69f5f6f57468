"""Operators and auditors: tokens for every role, playbooks with approvals, alert bodies."""

from __future__ import annotations

import base64
import functools
import pathlib

import pytest
import yaml

from tests.support import alerts

ROLES = ("ingest", "operator", "auditor", "admin")
TOKENS = {
    "alertmanager": ("ingest-token-0123456789", ["ingest"]),
    "olivia": ("operator-token-olivia-01", ["operator"]),
    "oscar": ("operator-token-oscar-0001", ["operator"]),
    "ada": ("auditor-token-ada-000001", ["auditor"]),
    "root": ("admin-token-root-0000001", ["admin"]),
}
BY_ROLE = {"ingest": "alertmanager", "operator": "olivia", "auditor": "ada", "admin": "root"}

GATED = """
name: gated
match: {alertname: GPUXidError79}
steps:
  - {id: note, action: test.record, params: {label: note}}
  - {id: drain, action: test.record, params: {label: drain}, requires_approval: true,
     description: "drain the node"}
"""

TWO_PERSON = """
name: two-person
match: {alertname: GPUXidError79}
steps:
  - {id: drain, action: test.record, params: {label: drain}, requires_approval: true,
     approvals: 2}
"""

MANUAL = """
name: return-to-service
manual: true
description: Uncordon a repaired node
parameters:
  reason: {type: string, required: true}
  retries: {type: integer, default: 1}
steps:
  - {id: uncordon, action: test.record, params: {label: "back {{ params.reason }}"},
     requires_approval: true}
"""


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name][0]}"}


def basic(name: str) -> dict[str, str]:
    raw = base64.b64encode(f"{name}:{TOKENS[name][0]}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def write_tokens(
    directory: pathlib.Path, extra: dict[str, list[str]] | None = None
) -> pathlib.Path:
    entries = [
        {"name": name, "token": token, "roles": roles} for name, (token, roles) in TOKENS.items()
    ]
    for name, roles in (extra or {}).items():
        entries.append({"name": name, "token": f"{name}-token-padding-000000", "roles": roles})
    path = directory / "tokens.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


@pytest.fixture
def tokens_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return write_tokens(tmp_path)


# Operator tests' alerts name a GPU, so GPU filters and links have one to find.
alert_body = functools.partial(alerts.alert_body, gpu="GPU-5fa3c0de-0000-4000-8000-000000000001")


async def waiting_step(h, headers=None):
    """The run waiting for approval and its waiting step."""
    response = await h.client.get("/api/v1/approvals", headers=headers or {})
    assert response.status == 200, await response.text()
    [item] = (await response.json())["items"]
    return item["run"]["id"], item["step"]["id"]


async def detail(h, run_id):
    """A run's detail, read as admin (works with and without a tokens file)."""
    response = await h.client.get(f"/api/v1/runs/{run_id}", headers=bearer("root"))
    assert response.status == 200, await response.text()
    return await response.json()
