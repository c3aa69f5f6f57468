"""JSON Schemas of the bodies the OpenAPI document describes: what the server accepts (request
bodies, with every limit it enforces) and what it answers (response bodies).

The request schemas are the pydantic models the handlers validate with, completed by the checks
that run after the model: the webhook's storage limits (``alerts.check_limits``), its refusal of
NUL characters (``alerts.parse_payload``) and its one supported version.
"""

from __future__ import annotations

from typing import Any

import pydantic

from remediator.adapters.http import fleet, plan, responses
from remediator.domain import alerts, matching

NO_NUL = "^[^\\x00]*$"  # Postgres cannot store NUL in text: intake refuses it everywhere
REF = "#/components/schemas/{model}"


def _labels(
    *, names: int, entries: int | None, values: dict[str, int], other: int | None
) -> dict[str, Any]:
    """A label (or annotation) map: names without NUL of at most ``names`` characters, values
    without NUL bounded by name (``values``) or, for any other name, by ``other``."""
    value: dict[str, Any] = {"type": "string", "pattern": NO_NUL}
    schema: dict[str, Any] = {
        "type": "object",
        "propertyNames": {"maxLength": names, "pattern": NO_NUL},
        "additionalProperties": value if other is None else {**value, "maxLength": other},
    }
    if values:
        schema["properties"] = {
            name: {**value, "maxLength": limit} for name, limit in values.items()
        }
    if entries is not None:
        schema["maxProperties"] = entries
    return schema


def _alert_labels() -> dict[str, Any]:
    limits = {"alertname": alerts.MAX_ALERTNAME}
    limits |= {name: alerts.MAX_NODE for name in matching.DEFAULT_NODE_LABELS}
    limits |= {name: alerts.MAX_GPU for name in matching.DEFAULT_GPU_LABELS}
    schema = _labels(
        names=alerts.MAX_NAME,
        entries=alerts.MAX_ENTRIES,
        values=limits,
        other=alerts.MAX_LABEL_VALUE,
    )
    schema["properties"]["alertname"]["minLength"] = 1
    schema["properties"]["instance"]["description"] = "at most 253 characters without its port"
    schema["required"] = ["alertname"]
    return schema


def webhook_payload() -> dict[str, dict[str, Any]]:
    """Alertmanager's webhook body (version 4) with everything intake refuses stated: a body
    that matches it is stored (unknown fields are ignored). The payload's schema and those it
    refers to, by name."""
    schema = alerts.WebhookPayload.model_json_schema(by_alias=True, ref_template=REF)
    found: dict[str, dict[str, Any]] = schema.pop("$defs")
    found["WebhookPayload"] = schema
    alert = found["Alert"]["properties"]
    alert["labels"] = _alert_labels()
    alert["annotations"] = _labels(
        names=alerts.MAX_NAME,
        entries=alerts.MAX_ENTRIES,
        values={},
        other=alerts.MAX_ANNOTATION_VALUE,
    )
    top = schema["properties"]
    for name in ("groupLabels", "commonLabels", "commonAnnotations"):
        top[name] = _labels(names=1024, entries=None, values={}, other=None)
    top["version"] = {"type": "string", "enum": ["4"], "default": "4"}
    for properties in (top, alert):
        for field in properties.values():
            if field.get("type") == "string" and "enum" not in field:
                field["pattern"] = NO_NUL
    for name in ("startsAt", "endsAt"):
        alert[name]["description"] = "RFC 3339; a time past the year 9999 in UTC is refused"
    found["PlanPayload"] = {
        "description": f"A webhook payload of at most {plan.MAX_ALERTS} alerts",
        "allOf": [{"$ref": REF.format(model="WebhookPayload")}],
        "properties": {"alerts": {"type": "array", "maxItems": plan.MAX_ALERTS}},
    }
    return found


# Web page forms (application/x-www-form-urlencoded).


class LoginForm(pydantic.BaseModel):
    token: str
    name: str = ""
    csrf: str


class DecisionForm(pydantic.BaseModel):
    comment: str
    csrf: str


class CsrfForm(pydantic.BaseModel):
    csrf: str


class TriggerForm(pydantic.BaseModel):
    """``node``, the runbook's parameters as ``param.<name>`` fields, and ``csrf``."""

    model_config = pydantic.ConfigDict(
        extra="allow",
        json_schema_extra={
            "patternProperties": {"^param\\.": {"type": "string"}},
            "additionalProperties": {"type": "string"},
        },
    )
    node: str = ""
    csrf: str


# Answers.


class Items(pydantic.BaseModel):
    items: list[dict[str, Any]]


class Stored(pydantic.BaseModel):
    status: str
    deliveryId: int
    alerts: int
    changed: int
    deduplicated: int


class Health(pydantic.BaseModel):
    status: str


class Ready(pydantic.BaseModel):
    status: str = pydantic.Field(description="ready or not ready")
    checks: dict[str, str]


ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "field": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    },
                },
            },
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}


def components() -> dict[str, Any]:
    """``components.schemas`` of the document."""
    models: tuple[type[pydantic.BaseModel], ...] = (
        *(Items, Stored, Health, Ready),
        fleet.Fleet,
    )
    found: dict[str, Any] = {"Error": ERROR, **webhook_payload()}
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        found |= schema.pop("$defs", {})
        found[model.__name__] = schema
    for answer in responses.SCHEMAS:
        schema = pydantic.TypeAdapter(answer).json_schema(ref_template=REF)
        found |= schema.pop("$defs", {})
        found[answer.__name__] = schema
    found["Launch"] = {
        "oneOf": [{"$ref": REF.format(model=name)} for name in ("Started", "StartedMany")]
    }
    return found
