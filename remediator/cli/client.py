"""The operator CLI's side: a small client of the server's API (token auth), and audit chain
verification of an export file (offline) or of a database.

It lives beside the commands, not in ``remediator.app``: commands that only talk HTTP must not
load the server (aiohttp's server, SQLAlchemy, the Kubernetes client) just to start. Only
``verify_database`` imports the database adapter, when it is called."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

import httpx

from remediator.domain import audit

if TYPE_CHECKING:
    from remediator.adapters.db import audit as db_audit


class ApiError(Exception):
    """The server answered with an error: one line, the API's code and message when it sent
    them (``{"error": {"code", "message"}}``), else the start of the body."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {_error_text(body)}")
        self.status = status
        self.body = body


def _error_text(body: str, limit: int = 200) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        text = f"{error.get('code', 'error')}: {error['message']}"
        fields = error.get("fields")
        if isinstance(fields, list) and fields:
            text += " (" + "; ".join(_field_text(f) for f in fields) + ")"
    else:
        text = body
    text = " ".join(text.split()) or "(no body)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _field_text(field: Any) -> str:
    if isinstance(field, dict):
        return f"{field.get('field', '?')}: {field.get('message', 'invalid')}"
    return str(field)


class Client:
    def __init__(self, server: str, token: str | None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.text)
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                response.status_code,
                f"the answer to {response.request.url} is not JSON: is this a remediator "
                f"server? It begins {response.text[:80]!r}",
            ) from None

    def get(self, path: str, **params: Any) -> Any:
        clean = {key: value for key, value in params.items() if value is not None}
        return self._check(self.http.get(path, params=clean))

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._check(self.http.post(path, json=body))

    def runs(self, **filters: Any) -> Any:
        return self.get("/api/v1/runs", **filters)

    def run(self, run_id: int) -> Any:
        return self.get(f"/api/v1/runs/{run_id}")

    def decide(self, run_id: int, step_id: int, *, approve: bool, comment: str) -> Any:
        verb = "approve" if approve else "reject"
        return self.post(f"/api/v1/runs/{run_id}/steps/{step_id}/{verb}", {"comment": comment})

    def trigger(self, playbook: str, *, node: str | None, params: dict[str, Any]) -> Any:
        return self.post(f"/api/v1/runbooks/{playbook}/runs", {"node": node, "params": params})

    def breaker(self) -> Any:
        return self.get("/api/v1/breaker")

    def fleet(
        self, state: str | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> Any:
        """Every GPU node as remediator sees it (those in ``state``; a page of ``limit`` of
        them after ``cursor``), budgets, the breaker and held steps."""
        return self.get("/api/v1/fleet", state=state, limit=limit, cursor=cursor)

    def reset_breaker(self, comment: str) -> Any:
        return self.post("/api/v1/breaker/reset", {"comment": comment})

    def verify(self) -> Any:
        return self.get("/api/v1/audit/verify")

    def export(self, out: IO[bytes], *, fmt: str, **filters: Any) -> int:
        """Stream an export into ``out``; returns the bytes written."""
        params = {"format": fmt} | {k: v for k, v in filters.items() if v is not None}
        written = 0
        with self.http.stream("GET", "/api/v1/audit/export", params=params) as response:
            if response.status_code >= 400:
                raise ApiError(response.status_code, response.read().decode(errors="replace"))
            kind = response.headers.get("content-type", "").split(";")[0].strip()
            if kind not in ("application/x-ndjson", "text/csv"):
                raise ApiError(
                    response.status_code,
                    f"the answer to {response.request.url} is {kind or 'untyped'}, not an "
                    "audit export: is this a remediator server?",
                )
            for chunk in response.iter_bytes():
                out.write(chunk)
                written += len(chunk)
        return written


def _events(path: pathlib.Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as stream:
        for line in stream:
            if line.strip():
                event: dict[str, Any] = json.loads(line)
                yield event if "trailer" in event else audit.from_export(event)


def verify_export(path: pathlib.Path, keys: audit.AuditKeys | None = None) -> audit.VerifyResult:
    """Verify a JSON Lines export offline (events named as the API names them, or with the
    store's names as older exports have them): each event's hash covers its content and its
    ``prevHash``; consecutive events link; event 1 links to the genesis hash; the trailer
    line matches the events (count, first and last id, last hash), and an unfiltered export
    holds consecutive ids. A filtered export is checked event by event and across every run
    of consecutive ids. Keyed events need the audit key, and once an event is keyed every
    later one must be."""
    previous: dict[str, Any] | None = None
    found = audit.ExportTrailer(filtered=False)
    trailer: audit.ExportTrailer | None = None
    unlinked: int | None = None  # the first event not linked to the one before it
    keyed = False
    for event in _events(path):
        if trailer is not None:
            return audit.VerifyResult(False, found.count, None, "lines after the trailer")
        if "trailer" in event:
            given = event["trailer"]
            trailer = audit.ExportTrailer(
                filtered=bool(given.get("filtered")),
                count=given.get("count"),
                first_id=given.get("firstId"),
                last_id=given.get("lastId"),
                last_hash=given.get("lastHash"),
            )
            continue
        broken = _broken_link(event, previous, keys)
        if broken is None and keyed and event.get("key_id") is None:
            broken = "an unkeyed event after keyed ones"
        keyed = keyed or event.get("key_id") is not None
        if broken is not None:
            return audit.VerifyResult(False, found.count, event["id"], broken)
        expected = previous["hash"] if previous is not None else audit.GENESIS
        if unlinked is None and event["prev_hash"] != expected:
            unlinked = event["id"]
        found.add(event["id"], event["hash"])
        previous = event
    if trailer is None:
        return audit.VerifyResult(False, found.count, None, "no trailer line: the file is cut")
    wrong = trailer.mismatch(found)
    if wrong is not None:
        return audit.VerifyResult(False, found.count, None, wrong)
    if not trailer.filtered and unlinked is not None:
        # Ids may skip (a Postgres sequence); the chain may not: an event is missing.
        why = "an event before it is missing from the unfiltered export"
        return audit.VerifyResult(False, found.count, unlinked, why)
    return audit.VerifyResult(True, found.count)


def _broken_link(
    event: dict[str, Any], previous: dict[str, Any] | None, keys: audit.AuditKeys | None
) -> str | None:
    if event["id"] == 1 and event["prev_hash"] != audit.GENESIS:
        return "first event does not start the chain"
    if previous is not None:
        if event["id"] <= previous["id"]:
            return "events out of order"
        if event["id"] == previous["id"] + 1 and event["prev_hash"] != previous["hash"]:
            return "prev_hash does not link"
    try:
        if audit.chain_hash(event["prev_hash"], event, keys) != event["hash"]:
            return "content does not match its hash"
    except audit.AuditKeyError as e:
        return str(e)
    return None


async def verify_database(
    url: str, *, keys: audit.AuditKeys | None = None, anchors: pathlib.Path | None = None
) -> db_audit.ChainReport:
    from remediator.adapters.db import audit as db_audit
    from remediator.adapters.db import database

    db = database.Database(url)
    try:
        return await db_audit.AuditQueries(db, keys=keys, anchors=anchors).verify()
    finally:
        await db.dispose()
