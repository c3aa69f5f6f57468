"""Hooks the engine and intake call for metrics; the app wires them to prometheus-client."""

from __future__ import annotations

from typing import Protocol


class Observer(Protocol):
    def run_finished(self, playbook: str, state: str) -> None: ...
    def runs_created(self, count: int) -> None: ...
    def step_finished(self, action: str, outcome: str, seconds: float) -> None: ...
    def claim_lag(self, seconds: float) -> None: ...


class NullObserver:
    def run_finished(self, playbook: str, state: str) -> None:
        return None

    def runs_created(self, count: int) -> None:
        return None

    def step_finished(self, action: str, outcome: str, seconds: float) -> None:
        return None

    def claim_lag(self, seconds: float) -> None:
        return None
