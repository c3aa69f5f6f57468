"""Auditors' API (role ``auditor`` or ``admin``): filtered history, streamed exports, chain
verification, raw alert deliveries and artifacts."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import pathlib
import re
from typing import Any

from aiohttp import web

from remediator.adapters.db import audit as db_audit
from remediator.adapters.http import api, hygiene, responses
from remediator.adapters.http import auth as http_auth
from remediator.domain import audit, auth, errors, terminal

# Export lines and CSV columns: the API's event shape, in the order the chain hashes them.
EXPORT_FIELDS = tuple(
    responses.EVENT_NAMES[name]
    for name in (*audit.CONTENT_FIELDS, *audit.SEALING_FIELDS, "prev_hash", "hash")
)
MAX_ARTIFACT_PATH = 1024


@dataclasses.dataclass(frozen=True)
class AuditDeps:
    queries: db_audit.AuditQueries
    artifact_dir: pathlib.Path


AUDIT = web.AppKey("audit", AuditDeps)


# Queries widen ``since`` and ``until`` by a few minutes: keep a day from the datetime limits.
EARLIEST = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)
# ``since`` and ``until``: RFC 3339 date-times (offset required, no leap second) in the years
# 0002 to 9998, so that no offset takes them past EARLIEST or LATEST. The OpenAPI document
# states this pattern.
TIME_PATTERN = (
    r"^(000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])"
    r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
_TIME = re.compile(TIME_PATTERN)


def _time(name: str, value: str) -> dt.datetime:
    message = "an RFC 3339 time in the years 0002 to 9998 (e.g. 2026-01-31T12:00:00Z)"
    refused = errors.ValidationFailed(
        f"{name} must be {message}", fields=[{"field": name, "message": message}]
    )
    if not _TIME.fullmatch(value):
        raise refused
    try:  # a day the month does not have
        parsed = dt.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        raise refused from None
    parsed = parsed.astimezone(dt.UTC)
    if not EARLIEST <= parsed <= LATEST:
        raise refused
    return parsed


parse_time = _time


def parse_filters(
    request: web.Request, allowed: tuple[str, ...], extra: tuple[str, ...] = ()
) -> db_audit.Filters:
    hygiene.refuse_unknown_query(request, (*allowed, *extra))
    given = dict(request.query)
    values: dict[str, Any] = {key: given[key] for key in allowed if key in given}
    for name in ("since", "until"):
        if name in values:
            values[name] = _time(name, values[name])
    if "run" in values:
        run = hygiene.parse_id(values["run"])
        if run is None:
            raise errors.ValidationFailed(
                "run must be an integer id", fields=[{"field": "run", "message": "not an id"}]
            )
        values["run"] = run
    return db_audit.Filters(**values)


async def list_events(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.AUDIT)
    limit, cursor = api.paging(request)
    filters = parse_filters(request, db_audit.EVENT_FILTERS, ("limit", "cursor"))
    page = await request.app[AUDIT].queries.events(filters, limit=limit, cursor=cursor)
    return web.json_response(responses.page(page, responses.event_row))


async def list_runs(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.AUDIT)
    limit, cursor = api.paging(request)
    filters = parse_filters(request, db_audit.RUN_FILTERS, ("limit", "cursor"))
    page = await request.app[AUDIT].queries.runs(filters, limit=limit, cursor=cursor)
    return web.json_response(responses.page(page, responses.run))


def _csv_cell(key: str, value: Any) -> Any:
    if key in ("data", "rows") and value is not None:
        value = json.dumps(value, sort_keys=True)
    return terminal.spreadsheet_cell(value) if isinstance(value, str) else value


def _csv_rows(batch: list[dict[str, Any]], *, header: bool) -> bytes:
    """CSV for a spreadsheet: a text cell a spreadsheet would read as a formula (a reason
    starting with an alert's name, say) starts with ``'`` (``terminal.spreadsheet_cell``);
    JSON Lines is the export kept exact, and the one offline verification reads."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(EXPORT_FIELDS)
    for record in batch:
        event: dict[str, Any] = dict(responses.event(record))
        writer.writerow([_csv_cell(key, event[key]) for key in EXPORT_FIELDS])
    return buffer.getvalue().encode()


def _jsonl_rows(batch: list[dict[str, Any]]) -> bytes:
    lines = (dict(responses.event(record)) for record in batch)
    return "".join(
        json.dumps({key: event[key] for key in EXPORT_FIELDS}, ensure_ascii=False) + "\n"
        for event in lines
    ).encode()


async def export_events(request: web.Request) -> web.StreamResponse:
    """Matching events in chain order, with their hashes, streamed batch by batch."""
    http_auth.require(request, auth.Permission.AUDIT)
    fmt = request.query.get("format", "jsonl")
    if fmt not in ("jsonl", "csv"):
        raise errors.ValidationFailed(
            "format must be jsonl or csv", fields=[{"field": "format", "message": "jsonl|csv"}]
        )
    filters = parse_filters(request, db_audit.EVENT_FILTERS, ("format",))
    content_type = "application/x-ndjson" if fmt == "jsonl" else "text/csv"
    response = web.StreamResponse(
        headers={
            "Content-Type": f"{content_type}; charset=utf-8",
            "Content-Disposition": f'attachment; filename="audit-events.{fmt}"',
        }
    )
    batches = aiter(request.app[AUDIT].queries.stream_events(filters))
    batch = await anext(batches, None)  # a failing query still gets its error status
    await response.prepare(request)
    first = True
    chosen = any(value is not None for value in dataclasses.asdict(filters).values())
    trailer = audit.ExportTrailer(filtered=chosen)
    while batch is not None:
        chunk = _jsonl_rows(batch) if fmt == "jsonl" else _csv_rows(batch, header=first)
        await response.write(chunk)
        for event in batch:
            trailer.add(event["id"], event["hash"])
        first = False
        batch = await anext(batches, None)
    if first and fmt == "csv":
        await response.write(_csv_rows([], header=True))
    if fmt == "jsonl":
        await response.write(json.dumps({"trailer": trailer.json()}).encode() + b"\n")
    await response.write_eof()
    return response


async def verify_chain(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.AUDIT)
    report = await request.app[AUDIT].queries.verify()
    return web.json_response(responses.chain_report(report))


async def get_delivery(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.AUDIT)
    found = await request.app[AUDIT].queries.delivery(api.int_param(request, "delivery_id"))
    if found is None:
        raise errors.NotFound("delivery not found (or deleted by retention)")
    return web.json_response(responses.delivery(found))


def resolve_artifact(root: pathlib.Path, relative: str) -> pathlib.Path:
    """``relative`` inside ``root``, or ``NotFound``: absolute paths, ``..`` and symlinks that
    leave the directory are refused."""
    parts = pathlib.PurePosixPath(relative).parts
    if not relative or relative.startswith("/") or "\\" in relative or ".." in parts:
        raise errors.NotFound("no such artifact")
    if len(relative) > MAX_ARTIFACT_PATH or "\x00" in relative:
        raise errors.NotFound("no such artifact")
    try:
        base = root.resolve()
        path = (base / relative).resolve()
        found = path.is_relative_to(base) and path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or not encodable
        found = False
    if not found:
        raise errors.NotFound("no such artifact")
    return path


async def get_artifact(request: web.Request) -> web.StreamResponse:
    http_auth.require(request, auth.Permission.AUDIT)
    path = resolve_artifact(request.app[AUDIT].artifact_dir, request.match_info["path"])
    return web.FileResponse(
        path,
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{path.name}"',
        },
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/audit/events", list_events)
    app.router.add_get("/api/v1/audit/runs", list_runs)
    app.router.add_get("/api/v1/audit/export", export_events)
    app.router.add_get("/api/v1/audit/verify", verify_chain)
    app.router.add_get("/api/v1/deliveries/{delivery_id}", get_delivery)
    app.router.add_get("/api/v1/artifacts/{path:.+}", get_artifact)


__all__ = ["AUDIT", "AuditDeps", "add_routes"]
