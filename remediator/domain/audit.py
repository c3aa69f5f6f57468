"""The audit log's hash chain.

Each event's hash is ``sha256(prev_hash || canonical JSON of its content)``. Changing, reordering
or deleting any event breaks every later link, so ``verify`` reports the first broken one. The
first event links to ``GENESIS``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

GENESIS = "0" * 64

# What auditors may filter events by (the API's query parameters and the CLI's options).
EVENT_FILTERS = (
    "since",
    "until",
    "node",
    "gpu",
    "alertname",
    "fingerprint",
    "playbook",
    "action",
    "outcome",
    "principal",
    "kind",
    "run",
)
RUN_FILTERS = tuple(name for name in EVENT_FILTERS if name != "kind")

CONTENT_FIELDS = (
    "id",
    "at",
    "kind",
    "actor",
    "run_id",
    "step_id",
    "episode_id",
    "from_status",
    "to_status",
    "reason",
    "data",
)


def _plain(value: object) -> object:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    raise TypeError(f"cannot hash {type(value).__name__}")


def canonical(content: Mapping[str, Any]) -> str:
    """Content fields as canonical JSON; timestamps as UTC ISO 8601 (what exports carry)."""
    fields = {field: content.get(field) for field in CONTENT_FIELDS}
    if isinstance(fields["at"], str):
        fields["at"] = dt.datetime.fromisoformat(fields["at"])
    return json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain
    )


def chain_hash(prev_hash: str, content: Mapping[str, Any]) -> str:
    digest = hashlib.sha256()
    digest.update(prev_hash.encode())
    digest.update(canonical(content).encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    ok: bool
    checked: int
    first_broken_id: int | None = None
    reason: str = ""


@dataclasses.dataclass
class ExportTrailer:
    """The last line of a JSON Lines export: how many events it holds, the first and last id
    and the last hash, and whether a filter selected them. Offline verification compares the
    file with it, so a line removed from the middle, a cut tail or a removed first event fail
    (an unfiltered export must also hold consecutive ids)."""

    filtered: bool
    count: int = 0
    first_id: int | None = None
    last_id: int | None = None
    last_hash: str | None = None

    def add(self, event_id: int, event_hash: str) -> None:
        if self.first_id is None:
            self.first_id = event_id
        self.count += 1
        self.last_id, self.last_hash = event_id, event_hash

    def json(self) -> dict[str, Any]:
        return {
            "filtered": self.filtered,
            "count": self.count,
            "firstId": self.first_id,
            "lastId": self.last_id,
            "lastHash": self.last_hash,
        }

    def mismatch(self, found: ExportTrailer) -> str | None:
        """Why the events ``found`` in a file are not the ones this trailer describes."""
        for name, want, got in (
            ("events", self.count, found.count),
            ("first id", self.first_id, found.first_id),
            ("last id", self.last_id, found.last_id),
            ("last hash", self.last_hash, found.last_hash),
        ):
            if want != got:
                return f"the trailer says {name} {want}, the file holds {got}"
        return None


def verify(events: Iterable[Mapping[str, Any]]) -> VerifyResult:
    """Check a sequence of events (dicts with the content fields, prev_hash and hash)."""
    prev = GENESIS
    checked = 0
    for event in events:
        if event["prev_hash"] != prev:
            return VerifyResult(False, checked, event["id"], "prev_hash does not link")
        if chain_hash(prev, event) != event["hash"]:
            return VerifyResult(False, checked, event["id"], "content does not match its hash")
        prev = event["hash"]
        checked += 1
    return VerifyResult(True, checked)
