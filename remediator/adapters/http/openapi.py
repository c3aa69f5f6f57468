"""The OpenAPI 3.1 document of the whole HTTP API, built from a route table and the pydantic
models of the request bodies, and served at ``/api/v1/openapi.json``.

The document lists the routes the application actually registered (read from the aiohttp
router), each described by its entry in ``OPERATIONS``; a test checks that every registered
route has an entry and the document has nothing else. Each operation states every status the
server can answer with, and every limit it enforces on parameters and bodies: schemathesis runs
with all its checks against a live server and finds nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import pydantic
from aiohttp import web

from remediator import __version__
from remediator.adapters.http import audit as http_audit
from remediator.adapters.http import runbooks, schemas
from remediator.domain import fleet
from remediator.engine import operations

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
HTML = "text/html"
ERROR = {"$ref": "#/components/schemas/Error"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation:
    summary: str
    tag: str
    roles: tuple[str, ...] | None  # None: no authentication
    query: tuple[tuple[str, str, str], ...] = ()  # (name, JSON type, description)
    # Query schemas of this operation's own, where a name means something else here.
    schemas: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    body: type[pydantic.BaseModel] | str | None = None  # a model, or a components schema name
    media: str = JSON
    status: int = 200
    answer: str | None = None  # components schema of the success body
    database: bool = True  # reads or writes the database: 503 when it is unavailable
    conflict: bool = False  # 409 when the run or step moved on


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
    "since": {"type": "string", "format": "date-time", "pattern": http_audit.TIME_PATTERN},
    "until": {"type": "string", "format": "date-time", "pattern": http_audit.TIME_PATTERN},
    "format": {"type": "string", "enum": ["jsonl", "csv"], "default": "jsonl"},
    "state": {"type": "string", "enum": list(fleet.STATES)},
}
AUDIT_FILTERS = (
    ("since", "string", "RFC 3339 time (years 0002-9998), inclusive"),
    ("until", "string", "RFC 3339 time (years 0002-9998), exclusive"),
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
# The console's filters: plain strings, since a browser's form sends the empty ones too (a
# time that is not one is named on the page and left out).
PAGE_FILTERS = (
    ("status", "string", "run status (empty: any)"),
    ("playbook", "string", "playbook name"),
    ("node", "string", "node name"),
    ("alert", "string", "alert name"),
    ("principal", "string", "who triggered or acted"),
    ("from", "string", "UTC time, e.g. 2026-12-01T03:00 (inclusive)"),
    ("to", "string", "UTC time (exclusive)"),
    ("before", "string", "id: the page of older entries"),
)


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/api/v1/alerts"): Operation(
        summary="Alertmanager webhook (version 4 payload)",
        tag="intake",
        roles=("ingest", "admin"),
        body="WebhookPayload",
        answer="Stored",
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
        answer="EpisodePage",
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
        answer="RunPage",
    ),
    ("GET", "/api/v1/runs/{run_id}"): Operation(
        summary="A run: steps, outputs, approvals, audit events, alert and links",
        tag="runs",
        roles=READ,
        answer="RunDetail",
    ),
    ("POST", "/api/v1/runs/{run_id}/steps/{step_id}/approve"): Operation(
        summary="Approve a waiting step (distinct principals count towards `approvals`)",
        tag="approvals",
        roles=OPERATE,
        body=runbooks.CommentBody,
        answer="Decision",
        conflict=True,
    ),
    ("POST", "/api/v1/runs/{run_id}/steps/{step_id}/reject"): Operation(
        summary="Reject a waiting step (ends the run)",
        tag="approvals",
        roles=OPERATE,
        body=runbooks.CommentBody,
        answer="Decision",
        conflict=True,
    ),
    ("GET", "/api/v1/runs/{run_id}/plan"): Operation(
        summary="What the run's steps will do (node, GPUs, pods, PDBs, guard verdicts)",
        tag="runs",
        roles=READ,
        answer="RunPlan",
    ),
    ("POST", "/api/v1/plan"): Operation(
        summary="Plan a playbook for a node without running it",
        tag="runs",
        roles=READ,
        body="PlanPayload",
        answer="Plan",
    ),
    ("GET", "/api/v1/approvals"): Operation(
        summary="Steps waiting for approval with run, alert and Alertmanager link",
        tag="approvals",
        roles=READ,
        answer="Approvals",
    ),
    ("GET", "/api/v1/runbooks"): Operation(
        summary="Manual runbooks and their parameters",
        tag="runbooks",
        roles=READ,
        answer="Items",
        database=False,
    ),
    ("POST", "/api/v1/runbooks/{playbook}/runs"): Operation(
        summary="Start a manual runbook",
        tag="runbooks",
        roles=OPERATE,
        body=runbooks.TriggerBody,
        status=201,
        answer="Launch",
        conflict=True,
    ),
    ("GET", "/api/v1/fleet"): Operation(
        summary="Every GPU node's state as remediator sees it, the disruption budget per pool, "
        "the breaker and held steps",
        tag="guards",
        roles=READ,
        query=(
            (
                "state",
                "string",
                "only the nodes in this state: held, draining, faulty, cordoned, capped, "
                "remediating or healthy",
            ),
            ("limit", "integer", "nodes a page, by name (default: every node)"),
            ("cursor", "string", "nextCursor of the previous page (a node's name)"),
        ),
        schemas={
            "limit": {"type": "integer", "minimum": 1, "maximum": fleet.MAX_NODES_LIMIT},
            "cursor": {"type": "string", "pattern": operations.NODE_NAME, "maxLength": 253},
        },
        answer="Fleet",
    ),
    ("GET", "/api/v1/breaker"): Operation(
        summary="Circuit breaker state and the nodes the disruption budget counts",
        tag="guards",
        roles=READ,
        answer="BreakerStatus",
    ),
    ("POST", "/api/v1/breaker/reset"): Operation(
        summary="Close the circuit breaker",
        tag="guards",
        roles=OPERATE,
        body=runbooks.CommentBody,
        answer="BreakerStatus",
    ),
    ("GET", "/api/v1/audit/events"): Operation(
        summary="Audit events, filtered, newest first",
        tag="audit",
        roles=AUDIT,
        query=(*PAGING, *EVENT_FILTERS),
        answer="EventPage",
    ),
    ("GET", "/api/v1/audit/runs"): Operation(
        summary="Runs, filtered, newest first",
        tag="audit",
        roles=AUDIT,
        query=(*PAGING, *AUDIT_FILTERS),
        answer="RunPage",
    ),
    ("GET", "/api/v1/audit/export"): Operation(
        summary="Export audit events with their hashes (streamed, chain order)",
        tag="audit",
        roles=AUDIT,
        query=(("format", "string", "jsonl (default) or csv"), *EVENT_FILTERS),
        media="application/x-ndjson,text/csv",
    ),
    ("GET", "/api/v1/audit/verify"): Operation(
        summary="Verify the audit hash chain; reports the first broken link",
        tag="audit",
        roles=AUDIT,
        answer="ChainReport",
    ),
    ("GET", "/api/v1/deliveries/{delivery_id}"): Operation(
        summary="A raw Alertmanager delivery", tag="audit", roles=AUDIT, answer="Delivery"
    ),
    ("GET", "/api/v1/artifacts/{path}"): Operation(
        summary="An artifact (e.g. a bug report) under the artifact directory",
        tag="audit",
        roles=AUDIT,
        media="application/octet-stream",
        database=False,
    ),
    ("GET", "/api/v1/openapi.json"): Operation(
        summary="This document", tag="meta", roles=None, database=False
    ),
    ("GET", "/"): Operation(
        summary="The web console: redirects to /runbooks",
        tag="web",
        roles=None,
        media=HTML,
        status=303,
        database=False,
    ),
    ("GET", "/runbooks"): Operation(
        summary="Web page: approvals, runbooks, recent runs",
        tag="web",
        roles=READ,
        media=HTML,
    ),
    ("GET", "/runbooks/runs"): Operation(
        summary="Web page: runs, filtered and paged, with export links for auditors",
        tag="web",
        roles=READ,
        media=HTML,
        query=PAGE_FILTERS,
    ),
    ("GET", "/runbooks/audit"): Operation(
        summary="Web page: audit events, filtered and paged, with CSV and JSON Lines exports",
        tag="web",
        roles=AUDIT,
        media=HTML,
        query=(
            *PAGE_FILTERS,
            ("kind", "string", "event kind"),
            ("run", "integer", "run id"),
        ),
    ),
    ("GET", "/runbooks/fleet"): Operation(
        summary="Web page: the fleet (nodes, budgets, breaker, held steps), refreshed live; "
        "?state= and ?page= (200 nodes a page, the most urgent first)",
        tag="web",
        roles=READ,
        media=HTML,
    ),
    ("POST", "/runbooks/breaker/reset"): Operation(
        summary="Close the circuit breaker from the fleet page (form: comment, csrf)",
        tag="web",
        roles=("admin",),
        body=schemas.DecisionForm,
        media=HTML,
        status=303,
        conflict=True,
    ),
    ("GET", "/runbooks/login"): Operation(
        summary="Web page: sign in", tag="web", roles=None, media=HTML, database=False
    ),
    ("POST", "/runbooks/login"): Operation(
        summary="Sign in (form: token, name, csrf) into a session cookie",
        tag="web",
        roles=None,
        body=schemas.LoginForm,
        media=HTML,
        status=303,
        database=False,
    ),
    ("POST", "/runbooks/logout"): Operation(
        summary="Sign out (form: csrf)",
        tag="web",
        roles=READ,
        body=schemas.CsrfForm,
        media=HTML,
        status=303,
        database=False,
    ),
    ("GET", "/runbooks/runs/{run_id}"): Operation(
        summary="Web page: one run with live progress", tag="web", roles=READ, media=HTML
    ),
    ("POST", "/runbooks/runs/{run_id}/steps/{step_id}/approve"): Operation(
        summary="Approve from the web page (form: comment, csrf)",
        tag="web",
        roles=OPERATE,
        body=schemas.DecisionForm,
        media=HTML,
        status=303,
        conflict=True,
    ),
    ("POST", "/runbooks/runs/{run_id}/steps/{step_id}/reject"): Operation(
        summary="Reject from the web page (form: comment, csrf)",
        tag="web",
        roles=OPERATE,
        body=schemas.DecisionForm,
        media=HTML,
        status=303,
        conflict=True,
    ),
    ("POST", "/runbooks/{playbook}/trigger"): Operation(
        summary="Start a manual runbook from the web page (form: node, param.*, csrf)",
        tag="web",
        roles=OPERATE,
        body=schemas.TriggerForm,
        media=HTML,
        status=303,
        conflict=True,
    ),
    ("GET", "/healthz"): Operation(
        summary="The process answers", tag="health", roles=None, answer="Health", database=False
    ),
    ("GET", "/readyz"): Operation(
        summary="Database writable and playbooks loaded (503 with the same body otherwise)",
        tag="health",
        roles=None,
        answer="Ready",
    ),
    ("GET", "/metrics"): Operation(
        summary="Prometheus metrics", tag="health", roles=None, media="text/plain", database=False
    ),
}


def registered_routes(app: web.Application) -> list[tuple[str, str]]:
    """``(method, path template)`` of every route, HEAD and regex parts left out."""
    found = []
    for route in app.router.routes():
        if route.method in ("HEAD", "*") or route.resource is None:
            continue
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.resource.canonical)
        found.append((route.method, path))
    return sorted(set(found))


def _path_schema(name: str) -> dict[str, Any]:
    if name == "path":
        return {"type": "string", "minLength": 1, "description": "relative, without '..'"}
    if name == "playbook":
        return {"type": "string", "minLength": 1}
    return {"type": "string", "pattern": ID_PATTERN}


def _query_schema(kind: str) -> dict[str, Any]:
    # Any query parameter with a NUL character is refused (``hygiene``).
    return {"type": kind, "pattern": schemas.NO_NUL} if kind == "string" else {"type": kind}


def _parameters(path: str, operation: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": _path_schema(name)}
        for name in re.findall(r"\{(\w+)\}", path)
    ]
    params += [
        {
            "name": name,
            "in": "query",
            "required": False,
            "schema": operation.schemas.get(name) or _QUERY_SCHEMAS.get(name, _query_schema(kind)),
            "description": description,
        }
        for name, kind, description in operation.query
    ]
    return params


RETRY_AFTER = {"Retry-After": {"required": True, "schema": {"type": "string"}}}
_LOGIN = "/runbooks/login"


def _refusals(method: str, path: str, operation: Operation) -> dict[str, str]:
    """The error statuses of one operation, each with what it means."""
    page = path.startswith("/runbooks")
    found = {"421": "without a tokens file, a Host other than localhost, 127.0.0.1, [::1]"}
    found["400"] = (
        "invalid parameters or body (see error.fields)"
        if operation.query or operation.body is not None
        else "a query parameter with a NUL character"
    )
    if "{" in path:
        found["404"] = "not found (an id that is not ASCII decimal within 63 bits never is)"
    if operation.roles is not None:
        found["403"] = "role not allowed"
        if page and method == "GET":
            found["303"] = "not signed in: to the sign-in page"
        else:
            found["401"] = "no or wrong credentials"
        if not page:
            found["429"] = "too many wrong tokens from this address or name (see Retry-After)"
    if path == _LOGIN and method == "POST":
        found["401"] = "unknown token (the sign-in page again)"
        found["429"] = "too many failed sign-ins from this address or name (see Retry-After)"
    if method == "POST":
        found["403"] = (
            f"{'role not allowed, ' if operation.roles else ''}CSRF token missing or wrong "
            "(forms), or a cross-origin request (an Origin that is not the server's, or "
            "Sec-Fetch-Site: cross-site)"
        )
        found["408"] = "the body did not arrive within body_read_timeout"
        found["413"] = "body too large (webhook and plan: max_body_bytes; others: 64 KiB)"
        found["415"] = (
            "wrong Content-Type (JSON bodies: application/json; forms: "
            "application/x-www-form-urlencoded), or a compressed body (Content-Encoding)"
        )
    if operation.conflict:
        found["409"] = "the run or step is no longer in a state that allows it"
    if operation.database:
        found["503"] = "the database is unavailable (see Retry-After)"
    return found


def _error_responses(method: str, path: str, operation: Operation) -> dict[str, Any]:
    form_post = path.startswith("/runbooks/") and method == "POST"
    responses: dict[str, Any] = {}
    for code, text in sorted(_refusals(method, path, operation).items()):
        response: dict[str, Any] = {"description": text}
        if code == "303":
            response["headers"] = {"Location": {"required": True, "schema": {"type": "string"}}}
        elif code == "503" and path == "/readyz":
            response["content"] = {JSON: {"schema": {"$ref": "#/components/schemas/Ready"}}}
        else:
            response["content"] = {JSON: {"schema": ERROR}}
            if form_post and code in ("400", "401", "403", "404", "409"):
                response["content"][HTML] = {"schema": {"type": "string"}}
            if code in ("429", "503"):
                response["headers"] = RETRY_AFTER
        responses[code] = response
    return responses


def _success(operation: Operation) -> dict[str, Any]:
    success: dict[str, Any] = {"description": "OK"}
    if operation.status == 303:
        success["headers"] = {"Location": {"required": True, "schema": {"type": "string"}}}
        return success
    schema: dict[str, Any] = (
        {"$ref": f"#/components/schemas/{operation.answer}"}
        if operation.answer
        else {"type": "object"}
        if operation.media == JSON
        else {"type": "string"}
    )
    success["content"] = {media: {"schema": schema} for media in operation.media.split(",")}
    return success


def _request_body(path: str, operation: Operation) -> dict[str, Any] | None:
    if operation.body is None:
        return None
    if isinstance(operation.body, str):
        schema = {"$ref": f"#/components/schemas/{operation.body}"}
    else:
        schema = operation.body.model_json_schema()
    media = FORM if path.startswith("/runbooks/") else JSON
    return {"required": True, "content": {media: {"schema": schema}}}


def _operation(method: str, path: str, operation: Operation) -> dict[str, Any]:
    responses: dict[str, Any] = {str(operation.status): _success(operation)}
    responses.update(_error_responses(method, path, operation))
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
    body = _request_body(path, operation)
    if body is not None:
        document["requestBody"] = body
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
            "schemas": schemas.components(),
        },
    }


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(build(request.app))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/openapi.json", get_openapi)
