"""Fleet safety guards: decisions on whether a disruptive step may start now.

Disruptive actions (cordon, drain, taint, evict) are what hurt a fleet at scale: a bad alert
that cordons half the cluster, a flapping node remediated in a loop. Before a disruptive step
starts, the engine asks ``decide`` with a snapshot of persisted guard state and gets either
"go" or "hold until ..., because ...". A held step waits visibly (its reason is in its output
and in the audit trail) instead of failing. Non-disruptive steps are never held.

- **Budget**: at most ``max_nodes`` nodes, and at most ``max_percent`` of the GPU nodes,
  disrupted by remediator at once — per pool when ``pool_label`` names one. A node stays
  disrupted until it is returned to service. Nodes a runbook takes one by one inside a single
  step (the driver rollout) are counted the same way: ``within_budget`` before each node.
- **Circuit breaker**: more than ``max_disruptive_runs`` runs of disruptive playbooks started
  within ``breaker_window`` opens the breaker (a storm of alerts, whatever the budget lets
  through); it stays open until an operator resets it, and only runs started after the reset
  count towards tripping it again.
- **Node cooldown**: a node disrupted recently waits until ``node_cooldown`` has passed.
- **Change windows**: disruptive steps start only inside a configured window.
- **Driver upgrades**: a node the GPU Operator's upgrade controller is upgrading (its
  ``nvidia.com/gpu-driver-upgrade-state`` label in one of ``UPGRADING_STATES``), or that
  remediator's own driver rollout is upgrading (``UPGRADE_MARK`` = ``in-progress``), holds
  disruptive steps of other runs until the label says it is done: two controllers cordoning,
  draining and restarting one node's driver fight each other (and a drain racing the driver's
  module unload crashes every GPU process on it).
- The per-node daily limit (``max_per_node_per_day``) does not hold steps: runs beyond it need
  approval for their disruptive steps (decided when the run is created).

Everything here is pure: state comes in as a ``Snapshot``, time as ``now``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import zoneinfo
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

import pydantic

from remediator.domain import durations


class Weekday(enum.StrEnum):
    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


_DAYS = list(Weekday)


class ChangeWindow(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    days: list[Weekday] = pydantic.Field(default_factory=lambda: list(Weekday))
    start: dt.time = dt.time(0, 0)
    end: dt.time = dt.time(23, 59, 59)
    timezone: str = "UTC"

    @pydantic.field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {value!r}") from None
        return value

    def contains(self, now: dt.datetime) -> bool:
        local = now.astimezone(zoneinfo.ZoneInfo(self.timezone))
        if _DAYS[local.weekday()] not in self.days:
            return False
        moment = local.time().replace(tzinfo=None)
        if self.start <= self.end:
            return self.start <= moment < self.end
        return moment >= self.start or moment < self.end  # spans midnight

    def next_start(self, now: dt.datetime) -> dt.datetime:
        zone = zoneinfo.ZoneInfo(self.timezone)
        local = now.astimezone(zone)
        for offset in range(8):
            day = local.date() + dt.timedelta(days=offset)
            if _DAYS[day.weekday()] not in self.days:
                continue
            start = dt.datetime.combine(day, self.start, tzinfo=zone)
            if start > local:
                return start.astimezone(dt.UTC)
        return now + dt.timedelta(days=7)


class GuardConfig(pydantic.BaseModel):
    """Global guard settings; a playbook's ``guards:`` overrides any of them."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_nodes: int = pydantic.Field(
        default=2, ge=0, description="At most this many nodes disrupted by remediator at once."
    )
    max_percent: float = pydantic.Field(
        default=10.0, ge=0, le=100, description="At most this share of GPU nodes disrupted."
    )
    max_disruptive_runs: int = pydantic.Field(
        default=5,
        ge=1,
        description="More disruptive runs within `breaker_window` open the breaker.",
    )
    breaker_window: durations.Duration = dt.timedelta(minutes=10)
    node_cooldown: durations.Duration = pydantic.Field(
        default=dt.timedelta(0), description="A node disrupted recently waits this long."
    )
    max_per_node_per_day: int = pydantic.Field(
        default=3, ge=1, description="Runs per node per 24 h before disruptive steps need approval."
    )
    change_windows: list[ChangeWindow] = pydantic.Field(
        default_factory=list, description="Disruptive steps start only inside these (none: any)."
    )
    pool_label: str | None = pydantic.Field(
        default=None,
        description="Node label naming a pool (e.g. a rack or GPU type); when set, the budget "
        "applies within each pool.",
    )
    recheck: durations.Duration = pydantic.Field(
        default=dt.timedelta(seconds=15),
        description="How often a step held by a driver upgrade, and the first step in line "
        "for each disruption budget, is re-evaluated.",
    )
    budget_recheck: durations.Duration = pydantic.Field(
        default=dt.timedelta(minutes=5),
        description="How often the other steps held by the disruption budget, and those held "
        "by the open breaker, are re-evaluated if nothing wakes them first: a node leaving the "
        "budget (or the step before going on) wakes the next in line, a breaker reset and a "
        "rules reload wake them all.",
    )


class GuardOverride(pydantic.BaseModel):
    """A playbook's changes to the global guards (only what it sets)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_nodes: int | None = pydantic.Field(default=None, ge=0)
    max_percent: float | None = pydantic.Field(default=None, ge=0, le=100)
    max_disruptive_runs: int | None = pydantic.Field(default=None, ge=1)
    breaker_window: durations.Duration | None = None
    node_cooldown: durations.Duration | None = None
    max_per_node_per_day: int | None = pydantic.Field(default=None, ge=1)
    change_windows: list[ChangeWindow] | None = None
    pool_label: str | None = None

    def apply(self, base: GuardConfig) -> GuardConfig:
        # The values as they are: dumped first, a playbook's change windows became plain
        # dicts in the config, and every decision on its steps failed on them.
        update = {
            name: value
            for name in type(self).model_fields
            if (value := getattr(self, name)) is not None
        }
        return base.model_copy(update=update)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Persisted guard state as seen inside the deciding transaction."""

    disrupted_nodes: AbstractSet[str]
    """Read it in the decision it was taken for: the deciding transaction may share the set
    it keeps current (copying a storm's thousand disrupted nodes per decision was quadratic)."""
    gpu_nodes: int | None  # None: unknown (no cluster); the percentage cap is then not applied
    recent_runs: int  # disruptive runs started within the breaker window, after the last reset
    breaker_open: bool
    node_last_disrupted: dt.datetime | None
    node_labels: Mapping[str, str] | None = None  # the node's labels; None: unknown


#: What can hold a disruptive step (a verdict's ``kind``; the label of the held-steps metric).
HOLD_KINDS = ("change_window", "breaker", "driver_upgrade", "node_cooldown", "budget")

#: The GPU Operator's upgrade controller keeps each node's upgrade state in this label
#: (k8s-operator-libs ``upgrade`` package; "" or absent and ``upgrade-done``: not upgrading).
DRIVER_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
#: States in which the operator is working on the node. ``upgrade-failed`` is not among them:
#: the operator has stopped there and the node is a person's (or remediator's) to look at.
UPGRADING_STATES = frozenset(
    {
        "upgrade-required",
        "cordon-required",
        "wait-for-jobs-required",
        "pod-deletion-required",
        "drain-required",
        "node-maintenance-required",
        "post-maintenance-required",
        "pod-restart-required",
        "validation-required",
        "uncordon-required",
    }
)
#: remediator's own driver rollout marks the node it is upgrading with this label.
UPGRADE_MARK = "remediator.io/driver-upgrade"
UPGRADE_IN_PROGRESS = "in-progress"
UPGRADE_FAILED = "failed"


def driver_upgrade(labels: Mapping[str, str]) -> str | None:
    """Who is upgrading the node's GPU driver, described for a hold reason; None: nobody."""
    state = labels.get(DRIVER_UPGRADE_STATE, "")
    if state in UPGRADING_STATES:
        return f"the GPU Operator is upgrading its driver ({DRIVER_UPGRADE_STATE}={state})"
    if labels.get(UPGRADE_MARK) == UPGRADE_IN_PROGRESS:
        return f"remediator's driver rollout is upgrading it ({UPGRADE_MARK}={UPGRADE_IN_PROGRESS})"
    return None


@dataclasses.dataclass(frozen=True)
class Verdict:
    go: bool
    reason: str = ""
    until: dt.datetime | None = None
    trips_breaker: bool = False
    kind: str = ""


def budget_limit(config: GuardConfig, gpu_nodes: int | None) -> int:
    """The smaller of the absolute cap and the percentage (rounded up, so a small fleet can
    still have one node remediated; a percentage of 0 disables disruption)."""
    if gpu_nodes is None:
        return config.max_nodes
    by_percent = math.ceil(gpu_nodes * config.max_percent / 100)
    return min(config.max_nodes, by_percent)


def wait_key(kind: str, pool: str | None) -> str | None:
    """What a step held for ``kind`` waits for, when something wakes it before its due time:
    a node leaving the budget it was held by (``budget:<pool>``; ``budget:`` for a budget
    over the whole fleet) or the breaker's reset (``breaker:``). None: the hold ends at its
    due time (a change window opening, a cooldown ending, a driver upgrade rechecked)."""
    if kind == "budget":
        return _budget_key(pool)
    if kind == "breaker":
        return "breaker:"
    return None


def freed_keys(pool: str | None) -> tuple[str, ...]:
    """The budgets a node of ``pool`` leaving the disrupted ones frees a unit of (the whole
    fleet's, and its pool's): the oldest step waiting for each is woken."""
    return (_budget_key(None), _budget_key(pool)) if pool else (_budget_key(None),)


def _budget_key(pool: str | None) -> str:
    return f"budget:{pool or ''}"


def waited_for(key: str) -> str:
    """What a ``wait_key`` names, in words."""
    kind, _, pool = key.partition(":")
    if kind == "budget":
        return f"the disruption budget of pool {pool}" if pool else "the disruption budget"
    if kind == "breaker":
        return "the circuit breaker's reset"
    return key


def decide(
    config: GuardConfig, snapshot: Snapshot, *, node: str | None, now: dt.datetime
) -> Verdict:
    """May a disruptive step on ``node`` start now?"""
    if config.change_windows and not any(w.contains(now) for w in config.change_windows):
        start = min(w.next_start(now) for w in config.change_windows)
        reason = f"outside change windows; next opens {start.isoformat()}"
        return Verdict(False, reason, start, kind="change_window")
    woken = now + config.budget_recheck  # (or sooner: ``wait_key``)
    if snapshot.breaker_open:
        reason = "circuit breaker is open; an operator must reset it"
        return Verdict(False, reason, woken, kind="breaker")
    if snapshot.recent_runs > config.max_disruptive_runs:
        return Verdict(
            False,
            f"{snapshot.recent_runs} disruptive runs within {config.breaker_window}; "
            "circuit breaker opened",
            woken,
            trips_breaker=True,
            kind="breaker",
        )
    upgrading = driver_upgrade(snapshot.node_labels or {}) if node is not None else None
    if upgrading is not None:
        later = now + config.recheck
        return Verdict(False, f"node {node}: {upgrading}", later, kind="driver_upgrade")
    if node is not None and node in snapshot.disrupted_nodes:
        return Verdict(True, "node already disrupted by remediator")
    if config.node_cooldown and snapshot.node_last_disrupted is not None:
        ready = snapshot.node_last_disrupted + config.node_cooldown
        if ready > now:
            reason = f"node cooling down until {ready.isoformat()}"
            return Verdict(False, reason, ready, kind="node_cooldown")
    return within_budget(config, snapshot, node=node, now=now)


def within_budget(
    config: GuardConfig, snapshot: Snapshot, *, node: str | None, now: dt.datetime
) -> Verdict:
    """May one more node (``node``, unless already counted) be disrupted now?"""
    if node is not None and node in snapshot.disrupted_nodes:
        return Verdict(True, "node already disrupted by remediator")
    limit = budget_limit(config, snapshot.gpu_nodes)
    in_use = len(snapshot.disrupted_nodes)
    if in_use + 1 > limit:
        reason = f"disruption budget in use: {in_use} of {limit} nodes"
        return Verdict(False, reason, now + config.budget_recheck, kind="budget")
    return Verdict(True, f"within budget: {in_use + 1} of {limit} nodes")
