"""What the audit chain keeps outside the database: its HMAC keys and its anchors.

Keys come from a file (one key; the file name is its id) or a directory of such files, which
is how a Kubernetes Secret mounted as a volume looks. Anchors are JSON Lines appended to a
file: the chain head at a moment, signed with the current key.
"""

from __future__ import annotations

import json
import os
import pathlib

from remediator.domain import audit


def load_keys(path: pathlib.Path, current: str | None = None) -> audit.AuditKeys:
    """The keys under ``path``; ``current`` picks the signing key (may be omitted when there
    is only one). ``AuditKeyError`` says what is wrong."""
    try:
        files = (
            sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if path.is_dir()
            else [path]
        )
        keys: dict[str, bytes] = {}
        for file in files:
            if not audit.KEY_ID.fullmatch(file.name):
                raise audit.AuditKeyError(
                    f"{file.name}: a key file's name is the key id (letters, digits, . _ -)"
                )
            secret = file.read_bytes().strip()
            if len(secret) < audit.MIN_KEY_BYTES:
                raise audit.AuditKeyError(
                    f"{file.name}: an audit key needs at least {audit.MIN_KEY_BYTES} bytes"
                )
            keys[file.name] = secret
    except OSError as e:
        raise audit.AuditKeyError(f"{path}: {e.strerror or e}") from None
    if not keys:
        raise audit.AuditKeyError(f"{path}: no audit key")
    if current is None:
        if len(keys) > 1:
            raise audit.AuditKeyError("several audit keys: set audit_key_id to the signing one")
        current = next(iter(keys))
    if current not in keys:
        raise audit.AuditKeyError(f"audit_key_id {current!r} is not a key in {path}")
    return audit.AuditKeys(keys=keys, current=current)


def read_anchors(path: pathlib.Path) -> list[audit.Anchor]:
    """Anchors from a JSON Lines file (a missing file holds none)."""
    if not path.exists():
        return []
    anchors = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            anchors.append(audit.Anchor.parse(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path.name} line {number}: not an anchor ({e})") from None
    return anchors


def append_anchor(path: pathlib.Path, anchor: audit.Anchor) -> None:
    """Append one anchor and make it durable before returning."""
    line = json.dumps(anchor.json(), separators=(",", ":")) + "\n"
    with path.open("a") as stream:
        stream.write(line)
        stream.flush()
        os.fsync(stream.fileno())
