"""Hooks the engine and intake call for metrics; the app wires them to prometheus-client."""

from __future__ import annotations

import datetime as dt
from typing import Protocol


class Observer(Protocol):
    def run_finished(self, playbook: str, state: str) -> None: ...
    def runs_created(self, count: int) -> None: ...
    def step_finished(self, action: str, outcome: str, seconds: float) -> None: ...
    def claim_lag(self, seconds: float) -> None: ...
    # An engine pass ended at ``at``: it completed, or raised ``error`` (the loop goes on).
    def pass_finished(self, *, at: dt.datetime, error: Exception | None = None) -> None: ...
    def notice(self, kind: str) -> None:
        """Something on-call was told: a held or parked step, a suppressed or waiting run."""
        ...

    def quarantined(self, unit: str) -> None:
        """A unit of engine work (episode, start, advance, claim) failed too often."""
        ...

    def effect_reported(self, kind: str) -> None:
        """The reconciler found an effect ``orphaned`` (left in place after its alert
        resolved) or ``vanished`` (gone although the playbook keeps it)."""
        ...


class NullObserver:
    def run_finished(self, playbook: str, state: str) -> None:
        return None

    def runs_created(self, count: int) -> None:
        return None

    def step_finished(self, action: str, outcome: str, seconds: float) -> None:
        return None

    def claim_lag(self, seconds: float) -> None:
        return None

    def pass_finished(self, *, at: dt.datetime, error: Exception | None = None) -> None:
        return None

    def notice(self, kind: str) -> None:
        return None

    def quarantined(self, unit: str) -> None:
        return None

    def effect_reported(self, kind: str) -> None:
        return None
