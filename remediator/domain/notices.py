"""Where a notification goes: routing rules by label and the owner of a workload.

A notice names its channel, or leaves the choice to the routing configured here:

1. the owner of the workload it is about (a notice for a pod or a namespace): the first
   configured key (``team``, ``owner``, ...) found on the pod's labels, then its annotations,
   then the namespace's labels and annotations, mapped to a channel by ``owner.channels``;
2. else the first route whose matchers all match the notice's labels (the alert's labels plus
   ``playbook``, ``node`` and ``gpu`` of the run, and ``owner`` when one was found);
3. else the default channel.

The decision is pure and says why it was taken, so the step output can show it. Message
templates use the playbooks' own template syntax (``domain.templating``) with the namespaces
in ``TEMPLATE_NAMESPACES``: no code runs, a reference is a dictionary lookup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Annotated, ClassVar, Literal

import pydantic

from remediator.domain import matching, templating

CHANNEL_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
ChannelName = Annotated[str, pydantic.Field(pattern=CHANNEL_NAME)]

Severity = Literal["critical", "error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("critical", "error", "warning", "info")

#: What a channel's message template may reference (see ``templating``).
TEMPLATE_NAMESPACES: dict[str, frozenset[str] | None] = {
    "labels": None,
    "annotations": None,
    "data": None,  # the notice's data (a notify step's ``data``)
    "target": frozenset({"node", "gpu"}),
    "run": frozenset({"id", "playbook", "url"}),
    "notice": frozenset({"message", "severity", "channel", "event", "owner"}),
}


DOC_EXAMPLES = """\
A notify step that names a `channel` sends there. Otherwise, in this order: the owner of the
workload it is about (its `owner:` param: the first of `owner.keys` found on the pod's labels,
the pod's annotations, the namespace's labels, then its annotations, looked up in
`owner.channels`); the first route whose matchers all match the alert's labels (plus the run's
`playbook`, `node`, `gpu`, the workload's `namespace` and the `owner` found); the default
channel. The step output records the channel and why (`routed_by`).

```yaml
notify_routing:
  default_channel: default
  routes:                                   # first match wins
    - matchers: ['severity="critical"']
      channel: on-call
    - matchers: ['namespace=~"ml-.*"', 'alertname!="GPUXidError"']
      channel: ml-teams
    - matchers: ['node=~"gpu-rack-b-.*"']
      channel: gpu-chat
  owner:
    keys: [team, owner]                     # pod labels, pod annotations, then the namespace's
    channels:
      vision: ml-teams
      platform: gpu-chat
```

Routes and owners may only name configured channels (checked at start-up); the default channel
may be left unconfigured, its notices are then only logged.
"""


class Route(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    matchers: list[matching.Matcher] = pydantic.Field(
        min_length=1,
        description='Label matchers, Alertmanager syntax, all must match: namespace=~"ml-.*".',
    )
    channel: str = pydantic.Field(pattern=CHANNEL_NAME, description="Channel it sends to.")


class OwnerLookup(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    keys: list[str] = pydantic.Field(
        default_factory=lambda: ["team", "owner"],
        description="Label or annotation keys naming a workload's owner, in order; looked up "
        "on the pod (labels, then annotations), then on its namespace.",
    )
    channels: dict[str, ChannelName] = pydantic.Field(
        default_factory=dict,
        description="Owner (the value found under a key) to channel name; an owner not listed "
        "here is routed like any other notice (routes, then the default channel).",
    )


class Routing(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    doc_examples: ClassVar[str] = DOC_EXAMPLES
    default_channel: str = pydantic.Field(
        default="default",
        pattern=CHANNEL_NAME,
        description="Where a notice goes when it names no channel and nothing else matched.",
    )
    routes: list[Route] = pydantic.Field(
        default_factory=list, description="Label rules, first match wins."
    )
    owner: OwnerLookup = pydantic.Field(
        default_factory=OwnerLookup, description="The owner lookup for workload notices."
    )

    def channel_names(self) -> set[str]:
        """Every channel the routing refers to (settings check they exist)."""
        return (
            {self.default_channel}
            | {route.channel for route in self.routes}
            | set(self.owner.channels.values())
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Owner:
    value: str
    found_at: str  # e.g. "pod label team", "namespace annotation owner"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    channel: str
    reason: str  # one line: why this channel


def find_owner(
    keys: Iterable[str], sources: Iterable[tuple[str, Mapping[str, str]]]
) -> Owner | None:
    """The first key with a non-empty value, trying every key in one source before the next
    source (sources in order: pod labels, pod annotations, namespace labels, annotations)."""
    wanted = list(keys)
    for where, values in sources:
        for key in wanted:
            value = values.get(key, "").strip()
            if value:
                return Owner(value=value, found_at=f"{where} {key}")
    return None


def choose_channel(
    routing: Routing,
    *,
    explicit: str | None,
    labels: Mapping[str, str],
    owner: Owner | None,
) -> Choice:
    if explicit:
        return Choice(channel=explicit, reason="named by the step")
    if owner is not None:
        channel = routing.owner.channels.get(owner.value)
        if channel:
            return Choice(channel=channel, reason=f"owner {owner.value} ({owner.found_at})")
        labels = {**labels, "owner": owner.value}
    for index, route in enumerate(routing.routes):
        if matching.matches_all(route.matchers, labels):
            rules = ", ".join(str(m) for m in route.matchers)
            return Choice(channel=route.channel, reason=f"route {index + 1} ({rules})")
    return Choice(channel=routing.default_channel, reason="default channel")


def severity_of(value: str | None, *, default: Severity = "warning") -> Severity:
    """An alert's ``severity`` label as one of the four severities PagerDuty knows."""
    text = (value or "").strip().lower()
    aliases: dict[str, Severity] = {
        "critical": "critical",
        "page": "critical",
        "error": "error",
        "major": "error",
        "warning": "warning",
        "warn": "warning",
        "minor": "warning",
        "info": "info",
        "none": "info",
        "informational": "info",
    }
    return aliases.get(text, default)


def validate_template(text: str) -> None:
    """Raise ``templating.TemplateError`` if a channel's message template is malformed."""
    templating.validate(text, namespaces=TEMPLATE_NAMESPACES)


def render_template(text: str, context: Mapping[str, Mapping[str, str]]) -> str:
    return templating.render(text, context, namespaces=TEMPLATE_NAMESPACES)
