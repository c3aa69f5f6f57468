"""What the operator commands print: aligned tables for people, JSON or YAML for programs.

``table`` is the default on a terminal and JSON everywhere else (a pipe, a file, a script), so
``remediator runs list | jq`` works without an option. Tables show what an on-call engineer
reads first and leave the rest to ``--output json``. The renderers accept the API's field
names in camelCase and snake_case alike.

What a table or YAML prints may come from an alert's labels, which whoever shapes the alert
chooses: control characters and bidirectional overrides in it are printed escaped
(``\x1b``, ``\u202e``), never sent to the terminal, where they could move the cursor, clear
the screen, recolour or reorder what the operator reads (JSON escapes them itself).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

import yaml

from remediator.domain import terminal

FORMATS = ("table", "json", "yaml")
MAX_CELL = 60


def default_format(stream: TextIO) -> str:
    """``table`` on a terminal, ``json`` anywhere else."""
    try:
        return "table" if stream.isatty() else "json"
    except ValueError:  # a closed stream
        return "json"


class _Dumper(yaml.SafeDumper):
    """YAML whose strings holding an unsafe character are double-quoted: PyYAML escapes the
    control characters there itself, and the escapes ``terminal.printable`` writes for the rest are
    YAML's own, so the document still reads back as the API's answer."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if terminal.has_unsafe(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(value: Any, *, fmt: str, kind: str) -> str:
    """``value`` (an API answer of ``kind``) as text in ``fmt`` (one of ``FORMATS``)."""
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=True)
    if fmt == "yaml":
        text = yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        return terminal.printable(text.rstrip("\n"))
    renderer = _TABLES.get(kind, key_values)
    return terminal.printable(renderer(value))


def field(item: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """``item[name]`` given in camelCase, found in camelCase or snake_case."""
    if name in item:
        return item[name]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
    return item.get(snake, default)


def cell(value: Any) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        text = ", ".join(f"{k}={v}" for k, v in value.items())
    elif isinstance(value, list | tuple):
        text = ", ".join(str(v) for v in value)
    else:
        text = " ".join(str(value).split())
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """Columns aligned on the widest cell; the last column is not padded."""
    cells = [headers, *([cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [text.ljust(width) for text, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def when(value: Any) -> str:
    """An ISO timestamp as ``YYYY-MM-DD HH:MM:SS`` UTC (seconds are enough on a terminal)."""
    if not isinstance(value, str):
        return cell(value)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return value
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.UTC)
    return parsed.strftime("%Y-%m-%d %H:%M:%S")


def short_gpu(value: Any) -> Any:
    """A GPU UUID as its first 12 characters (``GPU-659ac159…``): enough to tell GPUs apart
    on a node; ``runs show`` and JSON keep it whole."""
    if isinstance(value, str) and value.startswith("GPU-") and len(value) > 13:
        return value[:12] + "…"
    return value


def key_values(value: Any) -> str:
    """A mapping as ``key: value`` lines (nested values as compact JSON)."""
    if not isinstance(value, Mapping):
        return json.dumps(value, indent=2, sort_keys=True)
    width = max((len(str(k)) for k in value), default=0)
    lines = []
    for key, item in value.items():
        shown = (
            json.dumps(item, sort_keys=True)
            if isinstance(item, Mapping | list)
            else cell(item)
            if item is None or isinstance(item, bool)
            else str(item)
        )
        lines.append(f"{str(key) + ':':<{width + 1}} {shown}")
    return "\n".join(lines)


def runs_table(page: Mapping[str, Any]) -> str:
    items = page.get("items") or []
    if not items:
        return "no runs"
    text = table(
        ["ID", "STATUS", "PLAYBOOK", "NODE", "GPU", "CREATED (UTC)", "REASON"],
        (
            [
                field(r, "id"),
                field(r, "status"),
                field(r, "playbook"),
                field(r, "node"),
                short_gpu(field(r, "gpu")),
                when(field(r, "createdAt")),
                field(r, "reason"),
            ]
            for r in items
        ),
    )
    cursor = field(page, "nextCursor")
    if cursor:
        text += f"\n(more: add --cursor {cursor})"
    return text


def _approvals(step: Mapping[str, Any]) -> str:
    if not field(step, "requiresApproval"):
        return "-"
    return f"{field(step, 'approvalsGiven', '?')}/{field(step, 'approvalsRequired', 1)}"


def _waiting_for(run: Mapping[str, Any]) -> str:
    """What a pending run waits for, and the run that holds it (when known)."""
    behind = field(run, "waitingBehind")
    held = f" (held by run #{behind})" if behind is not None else ""
    return f"{field(run, 'waitingFor')}{held}"


def run_detail(run: Mapping[str, Any]) -> str:
    alert = field(run, "alert") or {}
    head = {
        "run": f"#{field(run, 'id')} {field(run, 'playbook')} ({field(run, 'kind')})",
        "status": field(run, "status"),
        # (a pending run that could not start: the lock, or the playbook's slots, it waits for)
        **({"waiting": _waiting_for(run)} if field(run, "waitingFor") else {}),
        "node": f"{cell(field(run, 'node'))} GPU {cell(field(run, 'gpu'))}",
        "alert": f"{alert.get('alertname')} ({alert.get('status')})" if alert else None,
        "reason": field(run, "reason"),
        "created": when(field(run, "createdAt")),
        "finished": when(field(run, "finishedAt")),
        "dry run": field(run, "dryRun"),
    }
    parts = ["\n".join(f"{k + ':':<9} {cell(v)}" for k, v in head.items())]
    steps = field(run, "steps") or []
    approvals = field(run, "approvals") or []
    given: dict[Any, int] = {}
    for approval in approvals:
        given[field(approval, "stepId")] = given.get(field(approval, "stepId"), 0) + 1
    if steps:
        parts.append(
            table(
                ["STEP", "KEY", "ACTION", "STATUS", "APPROVALS", "ATTEMPT", "ERROR"],
                (
                    [
                        field(s, "id"),
                        field(s, "key"),
                        field(s, "action"),
                        field(s, "status"),
                        _approvals({**s, "approvalsGiven": given.get(field(s, "id"), 0)}),
                        f"{field(s, 'attempt', 0)}/{field(s, 'maxAttempts', '?')}",
                        field(s, "error"),
                    ]
                    for s in steps
                ),
            )
        )
    if approvals:
        parts.append(
            table(
                ["STEP", "DECISION", "BY", "AT (UTC)", "COMMENT"],
                (
                    [
                        field(a, "stepId"),
                        field(a, "decision"),
                        field(a, "principal"),
                        when(field(a, "at")),
                        field(a, "comment"),
                    ]
                    for a in approvals
                ),
            )
        )
    events = field(run, "events") or []
    if events:
        parts.append(_events(events))
    children = field(run, "childRuns") or []
    if children:
        shown = ", ".join(f"#{c.get('id')} {c.get('kind')} {c.get('status')}" for c in children)
        parts.append(f"linked runs: {shown}")
    waiting = [s for s in steps if field(s, "status") == "waiting_approval"]
    for step in waiting:
        parts.append(
            f"waiting for approval: remediator runs approve {field(run, 'id')} "
            f"{field(step, 'id')} --comment '…'"
        )
    return "\n\n".join(parts)


def _events(events: list[Mapping[str, Any]], last: int = 15) -> str:
    """The run's latest audit events (all of them: ``--output json``)."""
    shown = events[-last:]
    text = table(
        ["AT (UTC)", "ACTOR", "EVENT", "CHANGE", "REASON"],
        (
            [
                when(field(e, "at")),
                field(e, "actor"),
                field(e, "kind"),
                f"{field(e, 'fromStatus')} → {field(e, 'toStatus')}"
                if field(e, "toStatus")
                else None,
                field(e, "reason"),
            ]
            for e in shown
        ),
    )
    hidden = len(events) - len(shown)
    return (f"({hidden} earlier events: --output json)\n" if hidden else "") + text


def breaker(state: Mapping[str, Any]) -> str:
    if not field(state, "open"):
        lines = ["breaker: closed (remediation runs)"]
    else:
        since = field(state, "openedAt")
        lines = [
            f"breaker: OPEN — {cell(field(state, 'reason'))}"
            + (f" (since {when(since)} UTC)" if since else "")
        ]
        lines.append("close it: remediator breaker reset --comment '…'")
    rest = {k: v for k, v in state.items() if k not in ("open", "reason")}
    if rest:
        lines.append(key_values(rest))
    return "\n".join(lines)


def _capped(gpus: Any) -> list[str]:
    """Capped GPUs as ``GPU-1234abcd… 490 W (was 700 W)`` (or as given)."""
    shown = []
    for gpu in gpus or []:
        if not isinstance(gpu, Mapping):
            shown.append(str(gpu))
            continue
        uuid = str(gpu.get("uuid") or "?")
        text = uuid if len(uuid) <= 12 else uuid[:12] + "…"
        if gpu.get("limit") is not None:
            text += f" {gpu['limit']:g} W"
        if gpu.get("previous") is not None:
            text += f" (was {gpu['previous']:g} W)"
        shown.append(text)
    return shown


def _nodes(nodes: list[Mapping[str, Any]]) -> str:
    if not nodes:
        return "no GPU nodes"
    return table(
        ["NODE", "POOL", "STATE", "CORDONED", "READY", "RUNS", "CAPPED GPUS", "DETAIL"],
        (
            [
                field(n, "name"),
                field(n, "pool"),
                field(n, "state"),
                field(n, "cordoned"),
                field(n, "ready"),
                [f"#{r}" for r in field(n, "runs") or []],
                _capped(field(n, "cappedGpus")),
                field(n, "detail"),
            ]
            for n in nodes
        ),
    )


def _lines(view: Mapping[str, Any]) -> str:
    """The held steps waiting in line, a line each, and how many are listed below."""
    held, total = field(view, "held") or [], field(view, "heldTotal")
    said = [
        f"{field(line, 'steps')} held step(s) wait for {field(line, 'what')}, oldest first; "
        f"next: run {field(field(line, 'first'), 'run')} on {field(field(line, 'first'), 'node')}"
        for line in field(view, "lines") or []
    ]
    if isinstance(total, int) and total > len(held):
        said.append(f"{len(held)} of {total} held steps listed")
    return "\n".join(said)


def _held(held: list[Mapping[str, Any]]) -> str:
    if not held:
        return "held steps: none"
    return "held steps:\n" + table(
        ["RUN", "STEP", "ACTION", "NODE", "RECHECKED BY (UTC)", "REASON"],
        (
            [
                field(h, "run"),
                field(h, "step"),
                field(h, "action"),
                field(h, "node"),
                when(field(h, "until")),
                field(h, "reason"),
            ]
            for h in held
        ),
    )


def fleet(view: Mapping[str, Any]) -> str:
    """``GET /api/v1/fleet``: nodes, budgets, breaker, held steps."""
    parts = []
    if field(view, "clusterError"):
        parts.append(f"cluster: {cell(field(view, 'clusterError'))} (nodes from the store only)")
    nodes = field(view, "nodes") or []
    parts.append(_nodes(nodes))
    total, cursor = field(view, "nodesTotal"), field(view, "nextCursor")
    if isinstance(total, int) and len(nodes) < total:
        more = f"more: add --cursor {cursor}" if cursor else "the last of them"
        parts.append(f"{len(nodes)} of {total} nodes listed ({more})")
    budgets = field(view, "budgets") or []
    if budgets:
        parts.append(
            table(
                ["POOL", "DISRUPTED", "ALLOWED", "NODES"],
                (
                    [
                        field(b, "pool") or "(whole fleet)",
                        field(b, "used"),
                        field(b, "allowed"),
                        field(b, "nodes"),
                    ]
                    for b in budgets
                ),
            )
        )
    parts.append(breaker(field(view, "breaker") or {}).split("\n", 1)[0])
    parts.append(_held(field(view, "held") or []))
    if lines := _lines(view):
        parts.append(lines)
    if field(view, "truncated"):
        parts.append(
            f"more {', '.join(field(view, 'truncated'))} than the server reads: the oldest shown"
        )
    return "\n\n".join(parts)


def _plan_step(step: Mapping[str, Any]) -> list[Any]:
    preview = field(step, "preview") or {}
    would = preview.get("would") if isinstance(preview, Mapping) else preview
    guard = field(step, "guard")
    verdict = None
    if isinstance(guard, Mapping):
        verdict = "go" if guard.get("go") else f"held: {guard.get('reason')}"
    return [
        field(step, "key"),
        field(step, "action"),
        "yes" if field(step, "requiresApproval") else "-",
        verdict,
        field(step, "error") or would or ("disabled" if not field(step, "enabled", True) else ""),
    ]


def plan(result: Mapping[str, Any]) -> str:
    parts = [f"cluster: {field(result, 'cluster')}; guards: {field(result, 'guards')}"]
    for alert in field(result, "alerts") or []:
        lines = [f"alert: {_alert_line(field(alert, 'alert'))}"]
        for note in (field(alert, "note"), field(alert, "deduplicated")):
            if note:
                lines.append(f"  {note}")
        playbooks = field(alert, "playbooks") or []
        if not playbooks and not field(alert, "deduplicated"):
            lines.append("  no playbook matches: nothing would run")
        for found in playbooks:
            lines.append(
                f"  playbook {field(found, 'playbook')} on {cell(field(found, 'node'))} "
                f"GPU {cell(field(found, 'gpu'))}: would be {field(found, 'status')}"
                + (f" ({field(found, 'reason')})" if field(found, "reason") else "")
            )
            steps = field(found, "steps") or []
            if steps:
                rendered = table(
                    ["STEP", "ACTION", "APPROVAL", "GUARDS", "WOULD"],
                    (_plan_step(s) for s in steps),
                )
                lines.extend("    " + line for line in rendered.splitlines())
        parts.append("\n".join(lines))
    parts.append("live state in full (pods a drain evicts, current values): --output yaml")
    return "\n\n".join(parts)


def _alert_line(alert: Any) -> str:
    if not isinstance(alert, Mapping):
        return cell(alert)
    started = field(alert, "startsAt")
    return (
        f"{alert.get('alertname')} {alert.get('status')} (fingerprint "
        f"{alert.get('fingerprint')}" + (f", since {when(started)} UTC)" if started else ")")
    )


_TABLES: dict[str, Callable[[Any], str]] = {
    "runs": runs_table,
    "run": run_detail,
    "breaker": breaker,
    "fleet": fleet,
    "plan": plan,
}
