"""The stable interface every action implements, and what the engine hands it.

An action is a class with a pydantic ``Params`` model, ``check`` (is the effect already in
place?), ``apply`` and optionally ``undo``. The engine calls ``check`` before every attempt, so
an attempt that follows a crash finds the effect of the attempt that died and records it instead
of repeating it. Actions report failure by raising ``errors.ActionFailed`` (``temporary=True``
for the engine to retry later); anything else they raise counts as a permanent failure.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import pydantic

from remediator.domain import errors
from remediator.ports import cluster as cluster_port
from remediator.ports import notify as notify_port

P = TypeVar("P", bound=pydantic.BaseModel)

ProgressFn = Callable[[dict[str, Any]], Awaitable[None]]


async def no_progress(_: dict[str, Any]) -> None:
    """Progress reports go nowhere (the default; the reconciler only observes)."""
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActionContext:
    """What a step's action may know and use. Adapters are reached only through ports."""

    run_id: int
    step_id: int
    step_key: str
    attempt: int
    playbook: str
    node: str | None
    gpu: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    dry_run: bool
    now: Callable[[], dt.datetime]
    notifier: notify_port.Notifier
    cluster: cluster_port.Cluster | None = None
    services: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    progress: ProgressFn = no_progress
    applied_output: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        """Stable across retries and crashes of this step."""
        return f"run-{self.run_id}-step-{self.step_id}"

    def require_cluster(self) -> cluster_port.Cluster:
        if self.cluster is None:
            raise errors.ActionFailed("no Kubernetes cluster is configured")
        return self.cluster


@dataclasses.dataclass(frozen=True)
class Check:
    """The outcome of ``check``: ``in_place`` means the effect is already there."""

    in_place: bool
    output: dict[str, Any] = dataclasses.field(default_factory=dict)


class Presence(enum.StrEnum):
    """Whether an effect a step applied is still in the cluster (see ``Action.observe``)."""

    PRESENT = "present"  # exactly as the step left it
    CHANGED = "changed"  # changed since by someone else (another value, another holder)
    GONE = "gone"  # not there any more: reverted by hand, or lost with the cluster's state


@dataclasses.dataclass(frozen=True)
class Observation:
    presence: Presence
    detail: str  # one line for the audit trail and on-call: what was found


class Action(abc.ABC, Generic[P]):
    name: ClassVar[str]
    description: ClassVar[str]
    params_model: ClassVar[type[pydantic.BaseModel]]
    disruptive: ClassVar[bool] = False
    supports_undo: ClassVar[bool] = False
    #: Applying it returns the node to service (frees the node's disruption budget).
    returns_to_service: ClassVar[bool] = False
    #: Undoing it returns the node to service (the undo of a cordon).
    undo_returns_to_service: ClassVar[bool] = False
    #: ``observe`` can tell whether its effect is still in the cluster (the reconciler asks).
    observable: ClassVar[bool] = False
    #: What ``check``, ``apply`` and ``undo`` mean for it, one line each (for the reference).
    semantics: ClassVar[Mapping[str, str]] = {}

    @abc.abstractmethod
    async def check(self, ctx: ActionContext, params: P) -> Check:
        """Is the effect already in place? Must not change anything."""

    @abc.abstractmethod
    async def apply(self, ctx: ActionContext, params: P) -> dict[str, Any]:
        """Make the change; return what was done (stored as the step output)."""

    async def check_undo(self, ctx: ActionContext, params: P) -> Check:
        """Is the state ``undo`` would restore already there? Default: no."""
        return Check(in_place=False)

    async def undo(self, ctx: ActionContext, params: P) -> dict[str, Any]:
        """Reverse ``apply``; ``ctx.applied_output`` holds what it returned."""
        raise errors.ActionFailed(f"action {self.name} has no undo")

    async def observe(self, ctx: ActionContext, params: P) -> Observation:
        """Is the effect this step applied (``ctx.applied_output``: what ``apply`` returned,
        possibly partial when the outcome is unknown) still in the cluster? Must not change
        anything. Only for actions that set ``observable``."""
        raise NotImplementedError(f"action {self.name} cannot observe its effect")

    async def preview(self, ctx: ActionContext, params: P) -> dict[str, Any]:
        """What ``apply`` would do, read from live state; changes nothing (used by plans)."""
        out: dict[str, Any] = {"would": self.describe(params)}
        try:
            check = await self.check(ctx, params)
        except errors.RemediatorError as e:
            out["state_error"] = str(e)
        else:
            out |= {"already_in_place": check.in_place, "state": check.output}
        return out

    def describe(self, params: P) -> str:
        """One line for plans and the runbook page."""
        return f"{self.name}({params.model_dump_json()})"

    def parse(self, params: Mapping[str, Any]) -> P:
        return self.params_model.model_validate(dict(params))  # type: ignore[return-value]


class Registry:
    """Actions by name. The composition root registers the built-ins and any plugins."""

    def __init__(self) -> None:
        self._actions: dict[str, Action[Any]] = {}

    def register(self, action: Action[Any]) -> None:
        if action.name in self._actions:
            raise ValueError(f"action {action.name!r} is registered twice")
        self._actions[action.name] = action

    def get(self, name: str) -> Action[Any]:
        return self._actions[name]

    def __contains__(self, name: object) -> bool:
        return name in self._actions

    def names(self) -> list[str]:
        return sorted(self._actions)

    def params_models(self) -> dict[str, type[pydantic.BaseModel]]:
        return {name: action.params_model for name, action in self._actions.items()}

    def all(self) -> list[Action[Any]]:
        return [self._actions[name] for name in self.names()]
