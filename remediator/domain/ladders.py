"""The escalation ladder of a GPU: reset → reboot → replace, climbed across alert episodes.

NVIDIA's field guidance for a GPU that fell off the bus or returned uncorrectable memory
errors: try a GPU reset; if that fails (or the fault comes back), reboot the node; if it comes
back after the reboot, the GPU goes to RMA. One episode is one run of a playbook, so the rung
must survive the run: it is kept per GPU (node and GPU id) in durable state, and each new run
takes the next rung.

Invariants:
- A run gets one decision (``climb`` is idempotent per run: asked again, after a crash or a
  retry, it answers the rung already recorded for that run).
- Within a run the rung only goes up (``escalate``: a reset that failed makes this run's rung
  reboot; a row-remap failure makes it replace). It never goes down.
- The ladder starts over when the GPU has been quiet for ``forget_after`` since its last
  decision (a GPU that faulted once a year is not replaced for it).
- ``replace`` is the top: further episodes stay there until the GPU (its UUID) is replaced or
  an operator clears the state.
- A run may instead be *declined* (``decline``: the driver recommends no recovery action):
  it is on no rung, its rung steps stand aside, and the GPU's ladder (``rung``, ``at``) is
  left as it was, so a declined episode neither climbs nor resets it. A later escalation of
  the same run still takes a rung.

The state is a plain dict (JSON in the store); ``history`` keeps the last decisions for the
audit trail and the replacement notice.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from typing import Any

HISTORY = 20
NO_ACTION = "none"
"""The rung of a history entry that declines (see ``decline``)."""


class Rung(enum.StrEnum):
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"

    @property
    def level(self) -> int:
        return list(Rung).index(self)

    def next(self) -> Rung:
        order = list(Rung)
        return order[min(self.level + 1, len(order) - 1)]


def key(node: str, gpu: str | None) -> str:
    """Where a GPU's ladder is kept; a node-wide ladder when the alert names no GPU."""
    return f"ladder:{node}:{(gpu or 'node').lower()}"


def rung_of_run(state: Mapping[str, Any], run_id: int) -> Rung | None:
    """The rung recorded for ``run_id`` (its latest entry: escalations come last); None when
    there is none or the run was declined."""
    entry = _latest(state, run_id)
    if entry is None or entry.get("rung") == NO_ACTION:
        return None
    return Rung(entry["rung"])


def declined(state: Mapping[str, Any], run_id: int) -> dict[str, Any] | None:
    """The entry that declined ``run_id`` when that is its latest decision, else None."""
    entry = _latest(state, run_id)
    return entry if entry is not None and entry.get("rung") == NO_ACTION else None


def _latest(state: Mapping[str, Any], run_id: int) -> dict[str, Any] | None:
    for entry in reversed(state.get("history") or []):
        if entry.get("run_id") == run_id:
            return dict(entry)
    return None


def _entry(run_id: int, rung: Rung, now: dt.datetime, reason: str) -> dict[str, Any]:
    return {"run_id": run_id, "rung": rung.value, "at": now.isoformat(), "reason": reason}


def _with(state: Mapping[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    history = [*(state.get("history") or []), entry][-HISTORY:]
    return {"rung": entry["rung"], "at": entry["at"], "history": history}


def climb(
    state: Mapping[str, Any],
    *,
    run_id: int,
    now: dt.datetime,
    forget_after: dt.timedelta,
    start: Rung = Rung.RESET,
) -> tuple[Rung, dict[str, Any]]:
    """This run's rung and the new state: one above the last decision, or ``start`` (or the
    rung above it, whichever is higher) when there is none or it is older than
    ``forget_after``."""
    known = rung_of_run(state, run_id)
    if known is not None:
        return known, dict(state)
    last = state.get("rung")
    at = state.get("at")
    fresh = at is not None and now - dt.datetime.fromisoformat(at) <= forget_after
    if last is None or not fresh:
        rung, reason = start, "first episode" if last is None else "earlier episodes forgotten"
    else:
        above = Rung(last).next()
        rung = above if above.level >= start.level else start
        reason = f"previous episode reached {last}"
    return rung, _with(state, _entry(run_id, rung, now, reason))


def decline(
    state: Mapping[str, Any], *, run_id: int, now: dt.datetime, reason: str
) -> tuple[Rung | None, dict[str, Any]]:
    """Put ``run_id`` on no rung, unless it already has one (a decision is never lowered);
    returns the run's rung (None once declined) and the new state."""
    current = rung_of_run(state, run_id)
    if current is not None or declined(state, run_id) is not None:
        return current, dict(state)
    entry = {"run_id": run_id, "rung": NO_ACTION, "at": now.isoformat(), "reason": reason}
    return None, {**state, "history": [*(state.get("history") or []), entry][-HISTORY:]}


def escalate(
    state: Mapping[str, Any], *, run_id: int, to: Rung, now: dt.datetime, reason: str
) -> tuple[Rung, dict[str, Any]]:
    """Raise this run's rung to at least ``to`` (never lowers it)."""
    current = rung_of_run(state, run_id)
    if current is not None and current.level >= to.level:
        return current, dict(state)
    return to, _with(state, _entry(run_id, to, now, reason))
