"""The audit log's hash chain.

Each event's hash links it to the one before: ``HMAC-SHA256(key, prev_hash || canonical JSON of
its content)`` when an audit key is configured (the event names the key's id), else
``sha256(prev_hash || content)``. Changing, reordering or deleting any event breaks every later
link, so ``verify`` reports the first broken one; without the key nobody can compute a valid
link, so a database writer cannot edit an event and recompute the chain. The first event links
to ``GENESIS``.

An event also seals the rows its transaction wrote: ``rows`` maps a table (``runs``, ``steps``,
``approvals``) to row ids and the digest of each row's audited columns, so verification can
compare the tables with the chain.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import re
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


# Fields of keyed events added to the content (an unkeyed event without sealed rows hashes the
# same content as before they existed).
SEALING_FIELDS = ("key_id", "rows")

# An event's fields as the API and the export files name them (camelCase) beside the store's
# names, which the hash covers (``canonical``). Older exports have the store's names.
EXPORT_NAMES = {
    name: re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
    for name in (*CONTENT_FIELDS, *SEALING_FIELDS, "prev_hash", "hash")
}


def from_export(line: Mapping[str, Any]) -> dict[str, Any]:
    """An exported event with the store's field names, from a line in either naming."""
    if "prevHash" not in line:
        return dict(line)
    return {name: line.get(exported) for name, exported in EXPORT_NAMES.items()}


# Columns whose changes are not audited: lease bookkeeping, due times, what a pending run or
# a held step waits for, and the progress a running step reports (its final output is
# audited once it ends).
VOLATILE = {
    "runs": frozenset({"updated_at", "waiting_for"}),
    "steps": frozenset({"due_at", "lease_owner", "lease_expires_at", "waiting_for"}),
    "approvals": frozenset(),
}
SEALED_TABLES = tuple(VOLATILE)
# Step statuses in which ``output`` is still progress (or a hold note) rather than a result.
_UNSETTLED_STEP = frozenset({"pending", "running", "waiting_approval"})

KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MIN_KEY_BYTES = 32


class AuditKeyError(ValueError):
    """An audit key file that cannot be used."""


@dataclasses.dataclass(frozen=True)
class AuditKeys:
    """HMAC keys by id; ``current`` signs new events, the others verify older ones."""

    keys: Mapping[str, bytes]
    current: str

    def secret(self, key_id: str) -> bytes:
        try:
            return self.keys[key_id]
        except KeyError:
            raise AuditKeyError(f"audit key {key_id!r} is not configured") from None


def row_digest(table: str, row: Mapping[str, Any]) -> str:
    """The digest of a row's audited columns (``VOLATILE`` ones left out)."""
    skip = VOLATILE[table]
    if table == "steps" and row.get("status") in _UNSETTLED_STEP:
        skip = skip | {"output"}
    # (a whole float column reads back as int or float depending on the backend and path)
    fields = {
        name: int(value) if isinstance(value, float) and value.is_integer() else value
        for name, value in row.items()
        if name not in skip
    }
    return hashlib.sha256(_CANONICAL.encode(fields).encode()).hexdigest()


def _plain(value: object) -> object:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    raise TypeError(f"cannot hash {type(value).__name__}")


# Canonical JSON: sorted keys, no spaces, text as it is, datetimes in UTC. One encoder for
# all (``json.dumps`` with these options made one for every row and event hashed, a fifth of
# the time each took).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain
)


def canonical(content: Mapping[str, Any]) -> str:
    """Content fields as canonical JSON; timestamps as UTC ISO 8601 (what exports carry). The
    key id and sealed rows are part of the content when present."""
    return _json(_canonical_fields(content))


def _canonical_fields(content: Mapping[str, Any]) -> dict[str, Any]:
    fields = {field: content.get(field) for field in CONTENT_FIELDS}
    for field in SEALING_FIELDS:
        if content.get(field) is not None:
            fields[field] = content[field]
    if isinstance(fields["at"], str):
        fields["at"] = dt.datetime.fromisoformat(fields["at"])
    return fields


def _json(fields: Mapping[str, Any]) -> str:
    return _CANONICAL.encode(fields)


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """All of an event's link that does not depend on its place in the chain: its canonical
    JSON on either side of its id, and its key. A writer prepares these before it locks the
    chain's head, so what it does while holding the head (which every other writer waits
    for) is a hash an event: ``hash(prev_hash, id)`` equals ``chain_hash(prev_hash,
    {**content, "id": id}, keys)``."""

    before: bytes
    after: bytes
    secret: bytes | None

    @classmethod
    def of(cls, content: Mapping[str, Any], keys: AuditKeys | None = None) -> Link:
        """``AuditKeyError`` as ``chain_hash`` raises it."""
        fields = _canonical_fields(content)
        del fields["id"]
        # Keys are sorted: those before "id", then "id", then those after it.
        low = {name: value for name, value in fields.items() if name < "id"}
        high = {name: value for name, value in fields.items() if name > "id"}
        before = _json(low)[:-1] + ("," if low else "") + '"id":'
        after = "," + _json(high)[1:] if high else "}"
        return cls(before=before.encode(), after=after.encode(), secret=_secret(content, keys))

    def hash(self, prev_hash: str, event_id: int) -> str:
        message = b"%s%s%d%s" % (prev_hash.encode(), self.before, event_id, self.after)
        return _digest(self.secret, message)


def chain_hash(prev_hash: str, content: Mapping[str, Any], keys: AuditKeys | None = None) -> str:
    """The link of an event: keyed with the key its ``key_id`` names (``AuditKeyError`` if that key
    is not in ``keys``), plain sha256 for an event without a key id."""
    return _digest(_secret(content, keys), prev_hash.encode() + canonical(content).encode())


def _secret(content: Mapping[str, Any], keys: AuditKeys | None) -> bytes | None:
    """The key an event names (``None``: it names none, its link is plain sha256)."""
    key_id = content.get("key_id")
    if key_id is None:
        return None
    if keys is None:
        raise AuditKeyError(f"event signed with audit key {key_id!r}; no audit key is configured")
    return keys.secret(key_id)


def _digest(secret: bytes | None, message: bytes) -> str:
    if secret is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def mac(keys: AuditKeys, text: str) -> str:
    """``key_id:hex`` HMAC of ``text`` with the current key (delivery rows, anchors)."""
    digest = hmac.new(keys.secret(keys.current), text.encode(), hashlib.sha256).hexdigest()
    return f"{keys.current}:{digest}"


def check_mac(keys: AuditKeys, text: str, tag: str) -> bool:
    key_id, _, digest = tag.partition(":")
    try:
        secret = keys.secret(key_id)
    except AuditKeyError:
        return False
    want = hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, digest)


def delivery_text(row: Mapping[str, Any]) -> str:
    """What a delivery's MAC covers: every column but the MAC itself and the id (assigned by
    the database after the MAC is computed, so the intake writes each row once)."""
    fields = {name: value for name, value in row.items() if name not in ("id", "mac")}
    return _CANONICAL.encode(fields)


@dataclasses.dataclass(frozen=True)
class Anchor:
    """The chain head written outside the database at some moment."""

    last_id: int
    last_hash: str
    at: str
    mac: str | None = None

    def text(self) -> str:
        return f"{self.last_id}:{self.last_hash}:{self.at}"

    def json(self) -> dict[str, Any]:
        return {"at": self.at, "lastId": self.last_id, "lastHash": self.last_hash, "mac": self.mac}

    @classmethod
    def parse(cls, value: Mapping[str, Any]) -> Anchor:
        last_id, last_hash = value["lastId"], value["lastHash"]
        if not isinstance(last_id, int) or not isinstance(last_hash, str):
            raise ValueError("an anchor needs an integer lastId and a string lastHash")
        return cls(last_id, last_hash, str(value.get("at", "")), value.get("mac"))


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


class ChainCheck:
    """Walks events in chain order: each must link to the one before, match its hash (keyed
    with the key it names), stay keyed once the chain became keyed, and match every anchor
    written for its id. Collects the newest digest of every sealed row."""

    def __init__(self, keys: AuditKeys | None = None, anchors: Iterable[Anchor] = ()) -> None:
        self.keys = keys
        self.prev = GENESIS
        self.checked = 0
        self.last_id: int | None = None
        self.keyed_since: int | None = None
        self.anchors = {anchor.last_id: anchor for anchor in anchors}
        self.rows: dict[str, dict[int, str]] = {table: {} for table in SEALED_TABLES}
        self.first_sealed: dict[str, int] = {}
        self.compared = 0
        self.unsealed = 0

    def bad_anchor(self) -> str | None:
        """An anchor whose signature does not check (it was not written by a key holder)."""
        for anchor in self.anchors.values():
            if anchor.mac is None:
                continue
            if self.keys is None or not check_mac(self.keys, anchor.text(), anchor.mac):
                key_id = anchor.mac.partition(":")[0]
                return (
                    f"the anchor of event {anchor.last_id} is not signed by a configured key"
                    f" (it names key {key_id!r})"
                )
        return None

    def add(self, event: Mapping[str, Any]) -> str | None:
        """Why ``event`` breaks the chain, or ``None`` (and the walk moves past it)."""
        if event["prev_hash"] != self.prev:
            return "prev_hash does not link"
        if event.get("key_id") is None and self.keyed_since is not None:
            return f"an unkeyed event after the chain became keyed at event {self.keyed_since}"
        try:
            digest = chain_hash(self.prev, event, self.keys)
        except AuditKeyError as e:
            return str(e)
        if not hmac.compare_digest(digest, event["hash"]):
            return "content does not match its hash"
        anchor = self.anchors.pop(event["id"], None)
        if anchor is not None and anchor.last_hash != event["hash"]:
            return f"the event differs from the anchor written at {anchor.at}"
        if event.get("key_id") is not None and self.keyed_since is None:
            self.keyed_since = event["id"]
        for table, digests in (event.get("rows") or {}).items():
            if table not in self.rows:
                continue
            for row_id, row_digest in digests.items():
                number = int(row_id)
                self.rows[table][number] = row_digest
                if number < self.first_sealed.get(table, number + 1):
                    self.first_sealed[table] = number
        self.prev, self.last_id = event["hash"], event["id"]
        self.checked += 1
        return None

    def missing_anchor(self) -> Anchor | None:
        """An anchored event the walk never reached (a cut tail, a deleted or renumbered
        event): the oldest such anchor."""
        return min(self.anchors.values(), key=lambda anchor: anchor.last_id, default=None)

    def compare_row(self, table: str, row: Mapping[str, Any]) -> str | None:
        """Compare one row of a sealed table (walked in id order, after the events) with its
        sealed digest: changed or added outside the chain. Rows older than the first row the
        chain sealed predate sealing and count as ``unsealed``."""
        want = self.rows[table].pop(row["id"], None)
        if want is None:
            first = self.first_sealed.get(table)
            if first is not None and row["id"] > first:
                return f"{table} row {row['id']} is not in the audit chain"
            self.unsealed += 1
            return None
        self.compared += 1
        if row_digest(table, row) != want:
            return f"{table} row {row['id']} was changed outside the audit chain"
        return None

    def deleted_row(self, table: str) -> int | None:
        """A sealed row the table no longer holds (after ``compare_row`` saw every row)."""
        return min(self.rows[table], default=None)


def verify(events: Iterable[Mapping[str, Any]], keys: AuditKeys | None = None) -> VerifyResult:
    """Check a sequence of events (dicts with the content fields, prev_hash and hash)."""
    check = ChainCheck(keys)
    for event in events:
        broken = check.add(event)
        if broken is not None:
            return VerifyResult(False, check.checked, event["id"], broken)
    return VerifyResult(True, check.checked)
