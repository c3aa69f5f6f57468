"""The OpenAPI 3.1 document of the whole HTTP API, built from a route table and the pydantic
models of the request bodies, and served at ``/api/v1/openapi.json``.

The document lists the routes the application actually registered (read from the aiohttp
router), each described by its entry in ``OPERATIONS``; a test checks that every registered
route has an entry and the document has nothing else.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pydantic
from aiohttp import web

from remediator import __version__
from remediator.adapters.http import runbooks

JSON = "application/json"
ERROR = {"$ref": "#/components/schemas/Error"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation:
    summary: str
    tag: str
    roles: tuple[str, ...] | None  # None: no authentication
    query: tuple[tuple[str, str, str], ...] = ()  # (name, JSON type, description)
    body: type[pydantic.BaseModel] | None = None
    media: str = JSON
    status: int = 200


READ = ("operator", "auditor", "admin")
OPERATE = ("operator", "admin")
AUDIT = ("auditor", "admin")
PAGING = (
    ("limit", "integer", "page size, 1-500 (default 50)"),
    ("cursor", "integer", "nextCursor of the previous page"),
)
# Ids and cursors are ASCII decimal within 63 bits; a path id that is none is not found (404),
# a query id that is none is invalid (400).
ID_PATTERN = "^[0-9]{1,19}$"
MAX_ID = 2**63 - 1
_QUERY_SCHEMAS: dict[str, dict[str, Any]] = {
    "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
    "cursor": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
    "run": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
    "episode": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
    "since": {"type": "string", "format": "date-time"},
    "until": {"type": "string", "format": "date-time"},
}
AUDIT_FILTERS = (
    ("since", "string", "ISO 8601 time, inclusive"),
    ("until", "string", "ISO 8601 time, exclusive"),
    ("node", "string", "node name"),
    ("gpu", "string", "GPU UUID or index"),
    ("alertname", "string", "alert name"),
    ("fingerprint", "string", "alert fingerprint"),
    ("playbook", "string", "playbook name"),
    ("action", "string", "step action, e.g. node.drain"),
    ("outcome", "string", "status reached (events) or run status (runs)"),
    ("principal", "string", "who acted (events) or triggered / decided (runs)"),
    ("run", "integer", "run id"),
)
EVENT_FILTERS = (*AUDIT_FILTERS, ("kind", "string", "event kind, e.g. step.transition"))


class Page(pydantic.BaseModel):
    items: list[dict[str, Any]]
    nextCursor: str | None


class Approval(pydantic.BaseModel):
    runId: int
    stepId: int
    status: str
    approvalsRequired: int


class LoginForm(pydantic.BaseModel):
    token: str
    name: str | None = None
    csrf: str


class DecisionForm(pydantic.BaseModel):
    comment: str
    csrf: str


class BreakerReset(pydantic.BaseModel):
    comment: str = pydantic.Field(min_length=1, max_length=4000)


class PlanRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/api/v1/alerts"): Operation(
        summary="Alertmanager webhook (version 4 payload)", tag="intake", roles=("ingest", "admin")
    ),
    ("GET", "/api/v1/alerts"): Operation(
        summary="Alert episodes",
        tag="runs",
        roles=READ,
        query=(
            *PAGING,
            ("status", "string", "firing|resolved"),
            ("alertname", "string", ""),
            ("fingerprint", "string", ""),
        ),
    ),
    ("GET", "/api/v1/runs"): Operation(
        summary="Runs, newest first",
        tag="runs",
        roles=READ,
        query=(
            *PAGING,
            ("status", "string", ""),
            ("playbook", "string", ""),
            ("node", "string", ""),
            ("kind", "string", "alert|manual|undo"),
            ("episode", "integer", ""),
        ),
    ),
    ("GET", "/api/v1/runs/{run_id}"): Operation(
        summary="A run: steps, outputs, approvals, audit events, alert and links",
        tag="runs",
        roles=READ,
    ),
    ("POST", "/api/v1/runs/{run_id}/steps/{step_id}/approve"): Operation(
        summary="Approve a waiting step (distinct principals count towards `approvals`)",
        tag="approvals",
        roles=OPERATE,
        body=runbooks.CommentBody,
    ),
    ("POST", "/api/v1/runs/{run_id}/steps/{step_id}/reject"): Operation(
        summary="Reject a waiting step (ends the run)",
        tag="approvals",
        roles=OPERATE,
        body=runbooks.CommentBody,
    ),
    ("GET", "/api/v1/runs/{run_id}/plan"): Operation(
        summary="What the run's steps will do (node, GPUs, pods, PDBs, guard verdicts)",
        tag="runs",
        roles=READ,
    ),
    ("POST", "/api/v1/plan"): Operation(
        summary="Plan a playbook for a node without running it",
        tag="runs",
        roles=READ,
        body=PlanRequest,
    ),
    ("GET", "/api/v1/approvals"): Operation(
        summary="Steps waiting for approval with run, alert and Alertmanager link",
        tag="approvals",
        roles=READ,
    ),
    ("GET", "/api/v1/runbooks"): Operation(
        summary="Manual runbooks and their parameters", tag="runbooks", roles=READ
    ),
    ("POST", "/api/v1/runbooks/{playbook}/runs"): Operation(
        summary="Start a manual runbook",
        tag="runbooks",
        roles=OPERATE,
        body=runbooks.TriggerBody,
        status=201,
    ),
    ("GET", "/api/v1/breaker"): Operation(
        summary="Circuit breaker state", tag="guards", roles=READ
    ),
    ("POST", "/api/v1/breaker/reset"): Operation(
        summary="Close the circuit breaker", tag="guards", roles=OPERATE, body=BreakerReset
    ),
    ("GET", "/api/v1/audit/events"): Operation(
        summary="Audit events, filtered, newest first",
        tag="audit",
        roles=AUDIT,
        query=(*PAGING, *EVENT_FILTERS),
    ),
    ("GET", "/api/v1/audit/runs"): Operation(
        summary="Runs, filtered, newest first",
        tag="audit",
        roles=AUDIT,
        query=(*PAGING, *AUDIT_FILTERS),
    ),
    ("GET", "/api/v1/audit/export"): Operation(
        summary="Export audit events with their hashes (streamed, chain order)",
        tag="audit",
        roles=AUDIT,
        query=(("format", "string", "jsonl (default) or csv"), *EVENT_FILTERS),
        media="application/x-ndjson",
    ),
    ("GET", "/api/v1/audit/verify"): Operation(
        summary="Verify the audit hash chain; reports the first broken link",
        tag="audit",
        roles=AUDIT,
    ),
    ("GET", "/api/v1/deliveries/{delivery_id}"): Operation(
        summary="A raw Alertmanager delivery", tag="audit", roles=AUDIT
    ),
    ("GET", "/api/v1/artifacts/{path}"): Operation(
        summary="An artifact (e.g. a bug report) under the artifact directory",
        tag="audit",
        roles=AUDIT,
        media="application/octet-stream",
    ),
    ("GET", "/api/v1/openapi.json"): Operation(summary="This document", tag="meta", roles=None),
    ("GET", "/runbooks"): Operation(
        summary="Web page: approvals, runbooks, recent runs",
        tag="web",
        roles=READ,
        media="text/html",
    ),
    ("GET", "/runbooks/login"): Operation(
        summary="Web page: sign in", tag="web", roles=None, media="text/html"
    ),
    ("POST", "/runbooks/login"): Operation(
        summary="Sign in (form: token, name, csrf) into a session cookie",
        tag="web",
        roles=None,
        body=LoginForm,
        media="text/html",
        status=303,
    ),
    ("POST", "/runbooks/logout"): Operation(
        summary="Sign out (form: csrf)", tag="web", roles=READ, media="text/html", status=303
    ),
    ("GET", "/runbooks/runs/{run_id}"): Operation(
        summary="Web page: one run with live progress", tag="web", roles=READ, media="text/html"
    ),
    ("POST", "/runbooks/runs/{run_id}/steps/{step_id}/approve"): Operation(
        summary="Approve from the web page (form: comment, csrf)",
        tag="web",
        roles=OPERATE,
        body=DecisionForm,
        media="text/html",
        status=303,
    ),
    ("POST", "/runbooks/runs/{run_id}/steps/{step_id}/reject"): Operation(
        summary="Reject from the web page (form: comment, csrf)",
        tag="web",
        roles=OPERATE,
        body=DecisionForm,
        media="text/html",
        status=303,
    ),
    ("POST", "/runbooks/{playbook}/trigger"): Operation(
        summary="Start a manual runbook from the web page (form: node, param.*, csrf)",
        tag="web",
        roles=OPERATE,
        media="text/html",
        status=303,
    ),
    ("GET", "/healthz"): Operation(summary="The process answers", tag="health", roles=None),
    ("GET", "/readyz"): Operation(
        summary="Database writable and playbooks loaded", tag="health", roles=None
    ),
    ("GET", "/metrics"): Operation(
        summary="Prometheus metrics", tag="health", roles=None, media="text/plain"
    ),
}

_FORM_PATHS = re.compile(r"^/runbooks/")


def registered_routes(app: web.Application) -> list[tuple[str, str]]:
    """``(method, path template)`` of every route, HEAD and regex parts left out."""
    found = []
    for route in app.router.routes():
        if route.method in ("HEAD", "*") or route.resource is None:
            continue
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.resource.canonical)
        found.append((route.method, path))
    return sorted(set(found))


def _parameters(path: str, operation: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string"}
            if name in ("path", "playbook")
            else {"type": "string", "pattern": ID_PATTERN},
        }
        for name in re.findall(r"\{(\w+)\}", path)
    ]
    params += [
        {
            "name": name,
            "in": "query",
            "required": False,
            "schema": _QUERY_SCHEMAS.get(name, {"type": kind}),
            "description": description,
        }
        for name, kind, description in operation.query
    ]
    return params


def _error_responses(method: str, operation: Operation) -> dict[str, Any]:
    """Every operation's error answers (``hygiene`` and ``auth`` give most of them)."""
    listed = [("400", "invalid request"), ("404", "not found"), ("409", "conflict")]
    if operation.roles is not None:
        listed.append(("401", "no or wrong credentials"))
    if method == "POST":
        listed += [
            (
                "403",
                "role not allowed, CSRF token missing, or a cross-origin request (an Origin "
                "that is not the server's, or Sec-Fetch-Site: cross-site)",
            ),
            ("408", "the body did not arrive within body_read_timeout"),
            ("413", "body too large (webhook and plan: max_body_bytes; others: 64 KiB)"),
            (
                "415",
                "wrong Content-Type (JSON bodies: application/json; forms: "
                "application/x-www-form-urlencoded), or a compressed body (Content-Encoding)",
            ),
        ]
    elif operation.roles is not None:
        listed.append(("403", "role not allowed"))
    listed.append(("421", "without a tokens file, a Host other than localhost, 127.0.0.1, [::1]"))
    return {
        code: {"description": text, "content": {JSON: {"schema": ERROR}}}
        for code, text in sorted(listed)
    }


def _operation(method: str, path: str, operation: Operation) -> dict[str, Any]:
    success: dict[str, Any] = {"description": "OK"}
    if operation.status != 303:
        success["content"] = {operation.media: {"schema": {}}}
    responses: dict[str, Any] = {str(operation.status): success}
    responses.update(_error_responses(method, operation))
    document: dict[str, Any] = {
        "operationId": f"{method.lower()}_{re.sub(r'[^a-z0-9]+', '_', path.lower()).strip('_')}",
        "summary": operation.summary,
        "tags": [operation.tag],
        "parameters": _parameters(path, operation),
        "responses": responses,
        "x-roles": list(operation.roles or []),
    }
    document["security"] = (
        [{"bearer": []}, {"basic": []}, {"session": []}] if operation.roles else []
    )
    if operation.body is not None:
        media = "application/x-www-form-urlencoded" if _FORM_PATHS.match(path) else JSON
        document["requestBody"] = {
            "required": True,
            "content": {media: {"schema": operation.body.model_json_schema()}},
        }
    return document


def build(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path in registered_routes(app):
        operation = OPERATIONS.get((method, path))
        if operation is None:
            continue  # the consistency test names it
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, operation)
    return {
        "openapi": "3.1.0",
        "info": {"title": "remediator", "version": __version__},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {"type": "http", "scheme": "basic"},
                "session": {"type": "apiKey", "in": "cookie", "name": "remediator_session"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "fields": {"type": "array", "items": {"type": "object"}},
                            },
                            "required": ["code", "message"],
                        }
                    },
                },
                "Page": Page.model_json_schema(),
                "Approval": Approval.model_json_schema(),
            },
        },
    }


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(build(request.app))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/openapi.json", get_openapi)
