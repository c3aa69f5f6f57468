"""Playbooks: which alerts they answer, how they find their target, and their steps.

A playbook is loaded from YAML into these models and validated completely at load time:
matchers compile, templates parse, step ids are unique, and every step's params validate
against its action's own params model (templated values are validated again, with their
rendered values, when a run is created). A playbook that loads is a playbook that can run.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from remediator.domain import durations, matching, retry, templating
from remediator.domain import guards as guards_mod


class ResolvePolicy(enum.StrEnum):
    """What happens to a run when its alert resolves.

    ``cancel``: steps not yet started are cancelled (a pending approval is withdrawn).
    ``undo``: as ``cancel``, then the declared undo of every succeeded step runs, newest first.
    ``continue``: the run carries on to its end.
    """

    CANCEL = "cancel"
    UNDO = "undo"
    CONTINUE = "continue"


class OnFailure(enum.StrEnum):
    STOP = "stop"
    CONTINUE = "continue"


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class MatchSpec(_Strict):
    alertname: str | list[str] = pydantic.Field(
        description="Alert name(s) this playbook answers (exact; used as the match index)."
    )
    matchers: list[matching.Matcher] = pydantic.Field(
        default_factory=list,
        description='Further label matchers, Alertmanager syntax: severity=~"warning|critical".',
    )

    @property
    def alertnames(self) -> tuple[str, ...]:
        return (self.alertname,) if isinstance(self.alertname, str) else tuple(self.alertname)

    @pydantic.field_validator("alertname")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names or not all(names):
            raise ValueError("alertname must be a non-empty name or list of names")
        return value


class TargetSpec(_Strict):
    node_labels: list[str] = pydantic.Field(
        default_factory=lambda: list(matching.DEFAULT_NODE_LABELS),
        description="Labels to take the node from, in order; when left out, the "
        "target_node_labels setting. The first whose value (port stripped) is an existing "
        "Node, the IP of a pod, or a pod in the alert's namespace (standing for the node it "
        "runs on) wins; when none is, the run fails with every candidate and why.",
    )
    gpu_labels: list[str] = pydantic.Field(
        default_factory=lambda: list(matching.DEFAULT_GPU_LABELS),
        description="Labels to take the GPU (UUID, PCI bus id or index) from, first non-empty "
        "wins; GPU actions find it among what nvidia-smi reports on the node.",
    )
    require_node: bool = pydantic.Field(
        default=True, description="Refuse to run when no node can be found in the labels."
    )


class UndoSpec(_Strict):
    action: str | None = pydantic.Field(
        default=None, description="Another action to run as the undo; default: the step's own."
    )
    params: dict[str, Any] = pydantic.Field(default_factory=dict)
    timeout: durations.Duration = dt.timedelta(minutes=5)


class StepSpec(_Strict):
    id: str = pydantic.Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    action: str
    description: str = ""
    params: dict[str, Any] = pydantic.Field(default_factory=dict)
    enabled: bool = pydantic.Field(
        default=True, description="A disabled step is planned as skipped (kept for the record)."
    )
    requires_approval: bool = False
    approvals: int = pydantic.Field(default=1, ge=1, le=5)
    retries: retry.RetryPolicy = pydantic.Field(
        default_factory=lambda: retry.RetryPolicy(max_attempts=1)
    )
    timeout: durations.Duration = dt.timedelta(minutes=5)
    on_failure: OnFailure = OnFailure.STOP
    undo: bool | UndoSpec = pydantic.Field(
        default=False,
        description="true: the action's own undo runs on resolution; or an explicit undo step.",
    )

    @pydantic.field_validator("params")
    @classmethod
    def _templates_parse(cls, params: dict[str, Any]) -> dict[str, Any]:
        try:
            templating.validate_all(params)
        except templating.TemplateError as e:
            raise ValueError(f"template: {e}") from None
        return params

    @property
    def undo_spec(self) -> UndoSpec | None:
        if self.undo is True:
            return UndoSpec()
        return self.undo or None


class ParamType(enum.StrEnum):
    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"


class ParameterSpec(_Strict):
    """A parameter of a manual runbook, validated when an operator triggers it."""

    type: ParamType = ParamType.STRING
    description: str = ""
    required: bool = False
    default: str | int | bool | None = None
    pattern: str | None = None


def validate_parameters(
    specs: Mapping[str, ParameterSpec], given: Mapping[str, Any]
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """A manual trigger's parameters, typed and checked against the playbook's declaration."""
    problems = [
        {"field": f"params.{name}", "message": "unknown parameter"}
        for name in sorted(set(given) - set(specs))
    ]
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        if name not in given:
            if spec.required:
                problems.append({"field": f"params.{name}", "message": "required"})
            elif spec.default is not None:
                values[name] = spec.default
            continue
        value = given[name]
        expected = {ParamType.STRING: str, ParamType.INTEGER: int, ParamType.BOOLEAN: bool}
        if not isinstance(value, expected[spec.type]) or (
            spec.type is ParamType.INTEGER and isinstance(value, bool)
        ):
            problems.append({"field": f"params.{name}", "message": f"must be a {spec.type}"})
            continue
        if spec.pattern and isinstance(value, str) and not re.fullmatch(spec.pattern, value):
            problems.append({"field": f"params.{name}", "message": f"must match {spec.pattern}"})
            continue
        values[name] = value
    return values, problems


class SilenceSpec(_Strict):
    duration: durations.Duration = pydantic.Field(
        default=dt.timedelta(hours=2), description="Silence length; renewed while the run lasts."
    )
    labels: list[str] = pydantic.Field(
        default_factory=lambda: ["node"],
        description="Label names whose values (from the alert) the silence matches on.",
    )


class Playbook(_Strict):
    name: str = pydantic.Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    description: str = ""
    manual: bool = pydantic.Field(
        default=False, description="A runbook operators trigger by hand (no alert match)."
    )
    parameters: dict[str, ParameterSpec] = pydantic.Field(default_factory=dict)
    match: MatchSpec | None = None
    target: TargetSpec = pydantic.Field(default_factory=TargetSpec)
    concurrency: int = pydantic.Field(
        default=10, ge=1, le=10_000, description="At most this many active runs of the playbook."
    )
    cooldown: durations.Duration = pydantic.Field(
        default=dt.timedelta(0),
        description="After a run starts on a node, further alerts for that node within this "
        "time start no new run of this playbook. With `on_resolve: undo` the cooldown ends when "
        "the run's alert resolves: its fix is undone, so a new episode is handled again.",
    )
    cooldown_per: Literal["node", "gpu"] = pydantic.Field(
        default="node",
        description="What the cooldown is kept for: the node, or each GPU of it (a thermal cap "
        "for GPU 1 is not suppressed by the one for GPU 0).",
    )
    exclusive: bool = pydantic.Field(
        default=True, description="Hold the node: at most one exclusive run per node at a time."
    )
    dry_run: bool = False
    guards: guards_mod.GuardOverride = pydantic.Field(
        default_factory=guards_mod.GuardOverride,
        description="Overrides of the global fleet guards for this playbook's runs.",
    )
    silence: SilenceSpec | None = pydantic.Field(
        default=None,
        description="Silence the node's follow-up alerts in Alertmanager while a disruptive run "
        "is active.",
    )
    on_resolve: ResolvePolicy = ResolvePolicy.CANCEL
    steps: list[StepSpec] = pydantic.Field(min_length=1)

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> Playbook:
        ids = [step.id for step in self.steps]
        duplicates = sorted({step_id for step_id in ids if ids.count(step_id) > 1})
        if duplicates:
            raise ValueError(f"duplicate step ids: {', '.join(duplicates)}")
        if self.manual and self.match is not None:
            raise ValueError("a manual playbook has no match")
        if not self.manual and self.match is None:
            raise ValueError("match is required unless the playbook is manual")
        return self

    def step(self, step_id: str) -> StepSpec:
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)


#: JSON Schema key of a params field that chooses which pod or container remediator execs into
#: (the GPU driver pod's namespace, selector, container). Such a field takes a literal or is
#: left out for the setting; a template in it is refused when the playbook loads, so alert
#: data can never point an exec at another pod (a user's training pod, say).
EXEC_TARGET = "x-exec-target"


def exec_target_fields(params_model: type[pydantic.BaseModel]) -> frozenset[str]:
    """The fields of an action's params model declared as exec targets (see ``EXEC_TARGET``)."""
    return frozenset(
        name
        for name, field in params_model.model_fields.items()
        if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get(EXEC_TARGET)
    )


def exec_target_problems(
    where: str, params_model: type[pydantic.BaseModel], params: Mapping[str, Any]
) -> list[dict[str, str]]:
    """Exec-target fields of ``params`` (found at ``where``) that hold a template."""
    return [
        {
            "field": f"{where}.{name}",
            "message": "chooses the pod or container remediator execs into: give a literal or "
            "leave it out for the setting, never a template of alert or run data",
        }
        for name in sorted(exec_target_fields(params_model))
        if name in params and templating.templated_paths(params[name])
    ]


def validate_step_params(
    step: StepSpec, params_model: type[pydantic.BaseModel], params: Mapping[str, Any]
) -> list[dict[str, str]]:
    """Field errors of ``params`` against the action's model; templated fields are deferred,
    except exec targets, which may not be templated at all."""
    exec_problems = exec_target_problems(f"steps.{step.id}.params", params_model, params)
    return exec_problems + _model_problems(step, params_model, params)


def _model_problems(
    step: StepSpec, params_model: type[pydantic.BaseModel], params: Mapping[str, Any]
) -> list[dict[str, str]]:
    deferred = templating.templated_paths(dict(params))
    try:
        params_model.model_validate(dict(params))
    except pydantic.ValidationError as e:
        problems = []
        for item in e.errors(include_url=False, include_input=False):
            if tuple(item["loc"][:1]) in {path[:1] for path in deferred}:
                continue
            loc = ".".join(str(part) for part in item["loc"])
            problems.append({"field": f"steps.{step.id}.params.{loc}", "message": item["msg"]})
        return problems
    return []


class PlaybookIndex:
    """Playbooks by alertname: matching cost independent of the number of playbooks."""

    def __init__(self, playbooks: list[Playbook]) -> None:
        self.playbooks = {playbook.name: playbook for playbook in playbooks}
        self._by_alertname: dict[str, list[Playbook]] = {}
        for playbook in playbooks:
            if playbook.match is None:
                continue
            for alertname in playbook.match.alertnames:
                self._by_alertname.setdefault(alertname, []).append(playbook)

    def match(self, labels: Mapping[str, str]) -> list[Playbook]:
        candidates = self._by_alertname.get(labels.get("alertname", ""), [])
        return [
            playbook
            for playbook in candidates
            if playbook.match is not None and matching.matches_all(playbook.match.matchers, labels)
        ]

    def get(self, name: str) -> Playbook | None:
        return self.playbooks.get(name)

    def __len__(self) -> int:
        return len(self.playbooks)
