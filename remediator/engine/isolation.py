"""One unit of engine work fails alone: poison input never stops the engine.

An engine pass handles many units in one transaction (episodes into runs, run starts, advances,
step claims). Each unit runs inside a savepoint: when it raises, only its own writes are rolled
back, its failure is counted (a row that survives the rollback) and the pass goes on with the
next unit. A unit that failed ``limit`` times is quarantined: a decision of its own that takes
it out of the engine's queries (the episode marked handled, the run ended ``failed``) with an
``engine.quarantined`` audit event, so one bad row can never make every pass fail again.

A lost compare-and-set (``errors.Conflict``) is not a failure: another replica moved the row
first, and the unit is simply skipped.

Savepoints cost two statements per unit, a third of a pass's statements. So a transaction run
through ``transaction`` first runs its units without them; if any unit raises, that attempt is
rolled back whole and the transaction runs again with a savepoint per unit, which isolates the
failure as above. Failures are rare, so almost every pass pays for no savepoint at all. (The
work must be safe to run twice: it decides from the database only, and returns what it did.)
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import TypeVar

from remediator.domain import errors
from remediator.engine import lifecycle
from remediator.ports import store

logger = logging.getLogger("remediator.engine")

T = TypeVar("T")

FAILURES = "engine-failures:"
LIMIT = 3

# Transactions whose units run without savepoints (the first attempt of ``transaction``).
_WITHOUT_SAVEPOINTS: weakref.WeakSet[store.Tx] = weakref.WeakSet()


class Isolate(Exception):
    """A unit failed in a transaction running without savepoints: run it again with them."""


async def transaction(store_: store.Store, operation: str, work: Callable[[store.Tx], T]) -> T:
    """``store_.run(operation, work)``, its units without savepoints unless one fails."""

    def without_savepoints(tx: store.Tx) -> T:
        _WITHOUT_SAVEPOINTS.add(tx)
        tx.batch_inserts()  # (the attempt with savepoints creates runs one by one)
        try:
            result = work(tx)
            tx.write_pending()
        except (Isolate, errors.StoreUnavailable):
            raise
        except Exception as e:
            # A change or a new run held back to be written in batch meets its row (and the
            # database its values) only now, or at a read between units: with savepoints,
            # the unit it belongs to is the one that fails.
            raise Isolate(f"{type(e).__name__}: {e}"[:300]) from e
        return result

    try:
        return await store_.run(operation, without_savepoints)
    except Isolate as e:
        logger.info("%s: a unit failed (%r); again, each unit in a savepoint", operation, e)
        return await store_.run(operation, work)


@contextlib.contextmanager
def unit(tx: store.Tx) -> Iterator[None]:
    """A savepoint around one unit; without savepoints, any failure ends the attempt."""
    if tx not in _WITHOUT_SAVEPOINTS:
        with tx.savepoint():
            yield
        return
    try:
        yield
    except Exception as e:
        raise Isolate(f"{type(e).__name__}: {e}"[:300]) from e


def run_unit(
    tx: store.Tx,
    key: str,
    work: Callable[[], T],
    *,
    quarantine: Callable[[str], None],
    report: lifecycle.Report,
    limit: int = LIMIT,
) -> T | None:
    """``work()`` in a savepoint; ``None`` when it failed (and was counted or quarantined)."""
    mark = report.mark()
    try:
        with unit(tx):
            return work()
    except Isolate:
        raise
    except errors.Conflict as e:
        report.rewind(mark)
        logger.info("%s skipped: %s", key, e)
        return None
    except Exception as e:
        report.rewind(mark)
        error = f"{type(e).__name__}: {e}"[:500]
        logger.exception("engine unit %s failed", key)
    state = tx.get_guard_state(FAILURES + key)
    failures = int(state.get("failures", 0)) + 1
    if failures < limit:
        tx.set_guard_state(FAILURES + key, {"failures": failures, "error": error})
        return None
    tx.delete_guard_state(FAILURES + key)
    try:
        with tx.savepoint():
            quarantine(error)
            tx.add_event(
                "engine.quarantined",
                actor=lifecycle.ENGINE,
                reason=f"{key} failed {failures} times: {error}",
                data={"unit": key, "failures": failures, "error": error},
            )
    except Exception:
        logger.exception("could not quarantine %s", key)
        return None
    report.quarantined.append(key.split(":", 1)[0])
    return None
