"""The fleet's disruption budget, for actions that take nodes themselves inside one step.

Alert-driven runs take budget when a disruptive step on their node is admitted (the engine's
gate). A runbook that disrupts several nodes from one step (``gpu.driver_rollout``) asks here
before each node instead, so its nodes count like any other: ``take`` records the node as
disrupted by the run when the budget has room (the same decision, ``domain.guards``), and
``release`` gives it back once the node is in service again. The composition root puts an
implementation in ``ActionContext.services["budget"]``.
"""

from __future__ import annotations

from typing import Protocol

from remediator.domain import guards

SERVICE = "budget"


class Budget(Protocol):
    async def take(self, node: str, *, run_id: int, playbook: str) -> guards.Verdict:
        """Count ``node`` as disrupted by ``run_id`` if the budget allows (``verdict.go``)."""
        ...

    async def release(self, node: str, *, run_id: int) -> None:
        """``node`` is back in service: it no longer counts for ``run_id``."""
        ...
