"""What clients did to the cluster: a log of effect writes, for tests to check that no effect
was applied twice.

Logged: ``spec.unschedulable`` of nodes (cordon/uncordon), node labels and taints, GPU power
limits (``nvidia-smi -pl`` and the admin endpoint) and pod evictions and deletions. One entry
is one effect of one write: ``before`` is the value in place when the write arrived, ``after``
the value it left (``None`` for an absent label or taint). A write that explicitly names a
value already in place is logged too, with ``before == after``: the effect was applied again.
Writes through ``PUT`` replace the whole object and name nothing, so only their changes count.

Every entry carries the state *epoch* (new whenever the cluster is seeded from its fleet or
reset; kept when a restarted simulator restores its state file) and the *boot* (simulator
process start) it happened in. Within one epoch the log is the complete history of these
fields, so ``repeated`` can tell an effect applied twice from one applied, reversed and applied
again.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from remediator.sim import store

UNSCHEDULABLE = "node.unschedulable"
LABEL = "node.label"
TAINT = "node.taint"
POWER_LIMIT = "gpu.power_limit"
EVICTION = "pod.eviction"
DELETION = "pod.deletion"
REPEATABLE = frozenset({EVICTION, DELETION})
"""Kinds whose repeats are harmless: evicting or deleting a pod that is already terminating
changes nothing (the API server accepts it, and ``kubectl drain`` does it after a restart)."""

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Mutation:
    seq: int
    at: str
    epoch: str
    boot: int
    kind: str
    target: str
    """The node, or ``namespace/name`` of a pod."""
    key: str
    """Label key, taint ``key:effect``, GPU UUID or pod UID; empty for ``unschedulable``."""
    before: Any
    after: Any
    source: str
    """What wrote it: ``PATCH /api/v1/nodes/x``, ``exec nvidia-smi in ns/pod``, ``admin``."""

    def json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Log:
    def __init__(
        self,
        *,
        epoch: str | None = None,
        boot: int = 1,
        entries: Iterable[Mutation] = (),
    ) -> None:
        self.epoch = epoch or uuid.uuid4().hex[:12]
        self.boot = boot
        self.entries: list[Mutation] = list(entries)

    def record(
        self, kind: str, target: str, key: str, *, before: Any, after: Any, source: str
    ) -> Mutation:
        entry = Mutation(
            seq=self.entries[-1].seq + 1 if self.entries else 1,
            at=store.timestamp_precise(),
            epoch=self.epoch,
            boot=self.boot,
            kind=kind,
            target=target,
            key=key,
            before=before,
            after=after,
            source=source,
        )
        self.entries.append(entry)
        return entry

    def since(self, seq: int) -> list[Mutation]:
        return [e for e in self.entries if e.seq > seq]

    def dump(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "boot": self.boot,
            "entries": [e.json() for e in self.entries],
        }

    @classmethod
    def restored(cls, data: Mapping[str, Any]) -> Log:
        """The log of a restored state: same epoch and entries, the next boot."""
        return cls(
            epoch=str(data["epoch"]),
            boot=int(data["boot"]) + 1,
            entries=[Mutation(**entry) for entry in data["entries"]],
        )


def repeated(
    entries: Iterable[Mapping[str, Any]],
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """``(earlier, later)`` pairs where ``later`` applied the value ``earlier`` had applied to the
    same field, in the same epoch, while it was still in place (no write in between).

    Kinds in ``REPEATABLE`` are never reported.
    """
    last: dict[tuple[str, str, str, str], Mapping[str, Any]] = {}
    found: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    for entry in sorted(entries, key=lambda e: (e["epoch"], e["seq"])):
        if entry["kind"] in REPEATABLE:
            continue
        field = (entry["epoch"], entry["kind"], entry["target"], entry["key"])
        previous = last.get(field)
        if (
            previous is not None
            and previous["after"] == entry["after"]
            and entry["before"] == entry["after"]
        ):
            found.append((previous, entry))
        last[field] = entry
    return found


# ---- nodes ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Named:
    """The fields a write names explicitly (and may therefore re-apply)."""

    unschedulable: bool = False
    labels: frozenset[str] = frozenset()


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def named_in_patch(patch: Any) -> Named:
    """What a merge/strategic (an object) or JSON (a list of operations) patch names."""
    if isinstance(patch, dict):
        spec = patch.get("spec")
        meta = patch.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        return Named(
            unschedulable=isinstance(spec, dict) and "unschedulable" in spec,
            labels=frozenset(labels) if isinstance(labels, dict) else frozenset(),
        )
    unschedulable = False
    keys: set[str] = set()
    for op in patch if isinstance(patch, list) else []:
        path = op.get("path") if isinstance(op, dict) else None
        if not isinstance(path, str):
            continue
        if path == "/spec/unschedulable":
            unschedulable = True
        elif path.startswith("/metadata/labels/"):
            keys.add(_unescape(path[len("/metadata/labels/") :]))
        elif path == "/metadata/labels" and isinstance(op.get("value"), dict):
            keys.update(op["value"])
    return Named(unschedulable=unschedulable, labels=frozenset(keys))


def _taints(node: Obj) -> dict[str, str]:
    return {
        f"{t.get('key', '')}:{t.get('effect', '')}": str(t.get("value") or "")
        for t in node.get("spec", {}).get("taints") or []
    }


def record_node_write(log: Log, old: Obj, new: Obj, named: Named, *, source: str) -> None:
    """Log the effects of one write of a node (``old`` before it, ``new`` after it)."""
    target = new["metadata"]["name"]
    was = bool(old.get("spec", {}).get("unschedulable"))
    now = bool(new.get("spec", {}).get("unschedulable"))
    if was != now or named.unschedulable:
        log.record(UNSCHEDULABLE, target, "", before=was, after=now, source=source)
    old_labels = old["metadata"].get("labels") or {}
    new_labels = new["metadata"].get("labels") or {}
    for key in sorted(set(old_labels) | set(new_labels)):
        before, after = old_labels.get(key), new_labels.get(key)
        if before != after or key in named.labels:
            log.record(LABEL, target, key, before=before, after=after, source=source)
    old_taints, new_taints = _taints(old), _taints(new)
    for key in sorted(set(old_taints) | set(new_taints)):
        before, after = old_taints.get(key), new_taints.get(key)
        if before != after:
            log.record(TAINT, target, key, before=before, after=after, source=source)
