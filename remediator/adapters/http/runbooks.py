"""Operators' JSON API: pending approvals, manual runbooks and their triggers.

- ``GET /api/v1/approvals``: steps waiting for approval, each with its run, the decisions so far,
  the triggering alert (``generatorURL`` and an Alertmanager link) and where to decide;
- ``GET /api/v1/runbooks``: manual playbooks with their parameters;
- ``POST /api/v1/runbooks/{playbook}/runs``: start one for a node, parameters validated by the
  playbook; the run records the principal who triggered it.

A run has one target node: the body's ``node`` and the runbook's ``node`` parameter name the
same node, or only one of them is given and stands for both (the run locks, is audited on and
acts on it). Two different nodes are refused naming both.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import annotated_types
import pydantic
from aiohttp import web

from remediator.adapters.db import database, queries
from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import hygiene, operating, responses
from remediator.domain import alerts, auth, errors, playbooks
from remediator.engine import operations as operations_mod

NODE_NAME = operations_mod.NODE_NAME


# A runbook parameter's value: the types a playbook can declare; integers within 64 bits
# (5 or 5.0, as JSON has it).
ParamValue = (
    pydantic.StrictStr
    | pydantic.StrictBool
    | Annotated[
        int,
        annotated_types.Interval(ge=-(2**63), le=2**63 - 1),
        pydantic.BeforeValidator(alerts.json_integer),
    ]
)


class TriggerBody(pydantic.BaseModel):
    """Start a manual runbook: on ``node``, or on every GPU node ``selector`` matches."""

    model_config = pydantic.ConfigDict(
        extra="forbid",
        json_schema_extra={"not": {"required": ["node", "selector"]}},
    )
    node: str | None = pydantic.Field(
        default=None,
        pattern=NODE_NAME,
        description="Node the run holds and acts on; fills the runbook's `node` parameter, "
        "which, if given too, must name the same node.",
    )
    selector: str | None = pydantic.Field(
        default=None,
        max_length=1024,
        pattern=r"^[A-Za-z0-9_./=!,() -]+$",
        description="Label selector: start one run per matching GPU node (runbooks with a "
        "`node` parameter).",
    )
    params: dict[str, ParamValue] = pydantic.Field(
        default_factory=dict,
        description="Parameters declared by the playbook (strings, integers, booleans).",
    )
    dryRun: bool = pydantic.Field(default=False, description="Plan and record, touch nothing.")


class CommentBody(pydantic.BaseModel):
    """An approval or rejection (the comment is required)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    comment: str = pydantic.Field(
        min_length=1,
        max_length=4000,
        json_schema_extra={"pattern": "\\S"},
        description="Not only white space.",
    )

    @pydantic.field_validator("comment")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a comment is required")
        return value.strip()


@dataclasses.dataclass(frozen=True)
class RunbookDeps:
    db: database.Database
    rules: Any


RUNBOOKS = web.AppKey("runbooks", RunbookDeps)


async def read_json(request: web.Request, model: type[pydantic.BaseModel]) -> Any:
    """A JSON body validated by ``model``. The Content-Type must be JSON: a cross-site form
    cannot send that, so browser-held credentials cannot be replayed against the API."""
    body = await hygiene.read_json(request)
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as e:
        fields = [
            {"field": ".".join(str(p) for p in item["loc"]) or "body", "message": item["msg"]}
            for item in e.errors(include_url=False, include_input=False)
        ]
        raise errors.ValidationFailed("invalid body", fields=fields) from None


def manual_playbooks(rules: Any) -> list[playbooks.Playbook]:
    index: playbooks.PlaybookIndex = rules.index
    return sorted(
        (playbook for playbook in index.playbooks.values() if playbook.manual),
        key=lambda playbook: playbook.name,
    )


def runbook_json(playbook: playbooks.Playbook) -> dict[str, Any]:
    return {
        "name": playbook.name,
        "description": playbook.description,
        "parameters": {
            name: spec.model_dump(mode="json") for name, spec in playbook.parameters.items()
        },
        "steps": [
            {
                "id": step.id,
                "action": step.action,
                "description": step.description,
                "requiresApproval": step.requires_approval,
                "approvals": step.approvals,
            }
            for step in playbook.steps
        ],
        "trigger": f"/api/v1/runbooks/{playbook.name}/runs",
    }


async def list_approvals(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    found = await queries.pending_approvals(request.app[RUNBOOKS].db)
    items = [responses.pending_approval(item) for item in found.waiting]
    return web.json_response({"items": items, "total": found.total})


async def list_runbooks(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    books = manual_playbooks(request.app[RUNBOOKS].rules)
    return web.json_response({"items": [runbook_json(playbook) for playbook in books]})


async def trigger_runbook(request: web.Request) -> web.Response:
    principal = http_auth.require(request, auth.Permission.OPERATE)
    body: TriggerBody = await read_json(request, TriggerBody)
    name = request.match_info["playbook"]
    operations = request.app[operating.OPERATIONS]
    if body.selector is None:
        started = await operations.trigger(
            playbook=name,
            node=body.node,
            params=body.params,
            principal=principal.name,
            dry_run=body.dryRun,
        )
        return web.json_response(responses.started(started), status=201)
    operations.manual_playbook(name)  # not found before the body's fields are looked at
    if body.node is not None:
        raise errors.ValidationFailed("give node (or params.node) or selector, not both")
    selected = await operations.trigger_selected(
        playbook=name,
        selector=body.selector,
        params=body.params,
        principal=principal.name,
        dry_run=body.dryRun,
    )
    return web.json_response(responses.started_many(selected), status=201)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/approvals", list_approvals)
    app.router.add_get("/api/v1/runbooks", list_runbooks)
    app.router.add_post("/api/v1/runbooks/{playbook}/runs", trigger_runbook)
