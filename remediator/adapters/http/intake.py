"""``POST /api/v1/alerts``: validate, deduplicate, persist, answer. Never runs anything.

Status codes follow Alertmanager's retry rules: 5xx is retried at once with backoff, 4xx is
re-sent at the next group interval. So 400 only for bodies that can never be valid, 503 (with
Retry-After) when the store cannot take the write, and 200 only after the commit.

A body that could never be stored (``alerts.check_limits``: an alertname, node or GPU label
longer than its column, oversized labels or annotations; or a value the database itself
refuses) is 400 ``unstorable`` naming each field, never 503: a 503 would be retried forever.
The whole delivery is refused, valid alerts of the group included, and the message says so:
200 means every alert of the delivery is stored, and Alertmanager cannot re-send part of a
group. It re-sends the group at every group interval, refused each time (counted by
``remediator_deliveries_rejected_total{reason="unstorable"}``) until the labels are fixed at
the source.
"""

from __future__ import annotations

import dataclasses

import prometheus_client as prom
import pydantic
from aiohttp import web

from remediator.adapters.db import intake
from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import errors as http_errors
from remediator.adapters.http import hygiene
from remediator.adapters.metrics import Metrics
from remediator.domain import alerts, auth, errors


class _Children(dict[str, prom.Counter]):
    """The children of a labelled counter by label value, each looked up once."""

    def __init__(self, counter: prom.Counter) -> None:
        super().__init__()
        self.counter = counter

    def __missing__(self, value: str) -> prom.Counter:
        child = self[value] = self.counter.labels(value)
        return child


@dataclasses.dataclass(frozen=True)
class IntakeDeps:
    writer: intake.IntakeWriter
    metrics: Metrics
    max_body_bytes: int
    rejected: _Children = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rejected", _Children(self.metrics.deliveries_rejected))


INTAKE = web.AppKey("intake", IntakeDeps)


def _reject(
    deps: IntakeDeps,
    status: int,
    reason: str,
    message: str,
    *,
    fields: list[dict[str, str]] | None = None,
) -> web.Response:
    deps.rejected[reason].inc()
    return http_errors.error_response(status, reason, message, fields=fields)


def _unstorable(deps: IntakeDeps, count: int, problems: list[dict[str, str]]) -> web.Response:
    return _reject(
        deps,
        400,
        "unstorable",
        f"the whole delivery ({count} alert(s)) is refused: {len(problems)} value(s) in it can "
        "never be stored (see fields). Fix them where the alerts are made; until then "
        "Alertmanager's re-sends of this group are refused too.",
        fields=problems,
    )


async def post_alerts(request: web.Request) -> web.Response:
    deps = request.app[INTAKE]
    try:
        principal = http_auth.require(request, auth.Permission.INGEST)
    except web.HTTPException as e:
        deps.rejected["unauthorized" if e.status == 401 else "forbidden"].inc()
        raise
    try:
        hygiene.require_type(request, hygiene.JSON)
        body = await hygiene.read_body(request, limit=deps.max_body_bytes)
    except http_errors.Refused as e:  # 415, 413 or 408
        return _reject(deps, e.status, e.code, e.message)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return _reject(deps, 400, "invalid_encoding", f"body is not UTF-8: {e.reason}")
    try:
        payload = alerts.parse_payload(body)
    except pydantic.ValidationError as e:
        return _reject(
            deps,
            400,
            "invalid_payload",
            "not an Alertmanager webhook payload (version 4)",
            fields=alerts.validation_fields(e),
        )
    problems = alerts.check_limits(payload)
    if problems:
        return _unstorable(deps, len(payload.alerts), problems)
    try:
        stored = await deps.writer.store(
            intake.Delivery(
                payload=payload, body=text, principal=principal.name, remote=request.remote
            )
        )
    except errors.StoreUnavailable:
        deps.rejected["store_unavailable"].inc()
        raise
    except errors.ValidationFailed as e:  # the database refused a value of this delivery
        return _unstorable(deps, len(payload.alerts), [{"field": "(body)", "message": str(e)}])
    # (counted by the writer, once a batch: ``Metrics.count_stored``)
    body = _STORED % (stored.delivery_id, stored.alerts, stored.changed, stored.deduplicated)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


# The answer ``web.json_response`` wrote (``json.dumps``' separators), counts filled in.
_STORED = b'{"status": "stored", "deliveryId": %d, "alerts": %d, "changed": %d, "deduplicated": %d}'
