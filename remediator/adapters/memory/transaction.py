"""A transaction over the in-memory tables: copy-on-write, savepoints and the audit chain.

A transaction starts from the committed ``tables.Tables`` and copies a table the first time it
writes to it, so the committed tables never change underneath a reader and dropping the
transaction is its rollback. A savepoint starts the same copying over from the state where it
began, so a block that raises drops only its own writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any, Protocol, Self, TypeVar

from remediator.adapters.memory import tables
from remediator.domain import audit, records


class _Copyable(Protocol):
    def copy(self) -> Self: ...


Table = TypeVar("Table", bound=_Copyable)


class Transaction:
    def __init__(
        self,
        committed: tables.Tables,
        *,
        now: dt.datetime,
        yield_to: Callable[[], bool] | None = None,
    ) -> None:
        self.now = tables.utc_now(now)
        self._tables = dataclasses.replace(committed)  # the same tables until one is written
        self._owned: set[str] = set()
        self._yield_to = yield_to
        self._open = True

    @property
    def tables(self) -> tables.Tables:
        if not self._open:
            raise RuntimeError("the transaction is over")
        return self._tables

    def close(self) -> None:
        self._open = False

    def _own(self, name: str, table: Table) -> Table:
        """The transaction's own copy of a table, made on its first write."""
        if name in self._owned:
            return table
        owned = table.copy()
        setattr(self.tables, name, owned)
        self._owned.add(name)
        return owned

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested unit of work: when the block raises, its writes and events are dropped
        and the transaction goes on from where the block began."""
        before, owned = dataclasses.replace(self.tables), self._owned
        self._owned = set()  # writes in the block copy again, from the state before it
        try:
            yield
        except BaseException:
            self._tables, self._owned = before, owned
            raise
        self._owned |= owned

    def next_id(self, sequence: str) -> int:
        sequences = self._own("sequences", self.tables.sequences)
        sequences[sequence] = sequences.get(sequence, 0) + 1
        return sequences[sequence]

    def should_yield(self) -> bool:
        return self._yield_to is not None and self._yield_to()

    def batch_inserts(self) -> None:
        """Nothing is held back: every run is created where it is decided."""

    def write_pending(self) -> None:
        """Nothing is held back: every change is made where it is decided."""

    # -- audit -----------------------------------------------------------------------------

    def add_event(
        self,
        kind: str,
        *,
        actor: str,
        reason: str = "",
        run_id: int | None = None,
        step_id: int | None = None,
        episode_id: int | None = None,
        from_status: str | None = None,
        to_status: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append one audit event, linked into the hash chain in this transaction."""
        events = self._own("events", self.tables.events)
        last_id, last_hash = (events[-1].id, events[-1].hash) if events else (0, audit.GENESIS)
        content: dict[str, Any] = {
            "id": last_id + 1,
            "at": self.now,
            "kind": kind,
            "actor": actor,
            "run_id": run_id,
            "step_id": step_id,
            "episode_id": episode_id,
            "from_status": from_status,
            "to_status": to_status,
            "reason": reason,
            "data": tables.as_json(data or {}),
        }
        digest = audit.chain_hash(last_hash, content)
        events.append(records.AuditEvent(prev_hash=last_hash, hash=digest, **content))
