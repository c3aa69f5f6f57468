"""Step outputs and plan previews as tables an operator reads at a glance: the pods a drain
will evict (namespace, owner) and the disruption budgets that decide it, drain progress as a
bar, power limits as before → after, artifacts with their digest. Anything else is shown as
its fields, never as one JSON blob."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from remediator.adapters.http import console

esc = console.esc


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return (namespace, name) if name else ("", key)


def pods_table(preview: dict[str, Any]) -> str:
    """The pods a drain (or a GPU drain) would evict, with their owner."""
    pods = preview.get("pods")
    if not isinstance(pods, list):
        pods = [{"key": key} for key in preview.get("evict") or [] if isinstance(key, str)]
    blocking = preview.get("blocking_pdbs") or {}
    blocked = {pod for keys in blocking.values() for pod in keys}
    if not pods:
        return '<p class="evictions" id="no-evictions">No pod will be evicted.</p>'
    rows = []
    for pod in pods:
        key = str(pod.get("key") or f"{pod.get('namespace')}/{pod.get('name')}")
        namespace, name = _split(key)
        owner = pod.get("owner") or "none (not recreated)"
        gpus = pod.get("gpus")
        verdict = (
            '<span class="badge blocks">blocked by a PDB</span>'
            if key in blocked
            else '<span class="badge ok">evictable</span>'
        )
        rows.append(
            f'<tr class="evict-pod"><td>{esc(namespace)}</td><td>{esc(name)}</td>'
            f"<td>{esc(str(owner))}</td><td>{esc('' if gpus is None else str(gpus))}</td>"
            f"<td>{verdict}</td></tr>"
        )
    return (
        f'<table class="evictions"><caption class="muted">{_count(len(pods), "pod")} will be '
        "evicted"
        "</caption><tr><th>namespace</th><th>pod</th><th>owner</th><th>GPUs</th><th>now</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def pdb_table(preview: dict[str, Any]) -> str:
    pdbs = preview.get("pdbs")
    blocking = preview.get("blocking_pdbs") or {}
    if not isinstance(pdbs, list):
        pdbs = [{"key": key, "allowed": 0, "pods": pods} for key, pods in blocking.items()]
    if not pdbs:
        return '<p class="pdbs muted">No PodDisruptionBudget selects these pods.</p>'
    rows = "".join(
        f"<tr><td>{esc(str(pdb.get('key')))}</td><td>{esc(str(pdb.get('allowed')))}</td>"
        f"<td>{esc(', '.join(pdb.get('pods') or []))}</td><td>"
        + (
            '<span class="badge blocks">blocks now</span>'
            if (pdb.get("allowed") or 0) < 1
            else '<span class="badge ok">allows</span>'
        )
        + "</td></tr>"
        for pdb in pdbs
    )
    return (
        '<table class="pdbs"><tr><th>PodDisruptionBudget</th><th>disruptions allowed</th>'
        f"<th>pods it covers</th><th>verdict</th></tr>{rows}</table>"
    )


def _kv(values: dict[str, Any], *, skip: tuple[str, ...] = ()) -> str:
    rows = []
    for key, value in values.items():
        if key in skip or value in (None, "", [], {}):
            continue
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        rows.append(f"<dt>{esc(key)}</dt><dd>{esc(shown)}</dd>")
    return f'<dl class="facts">{"".join(rows)}</dl>' if rows else ""


def power_table(gpus: list[dict[str, Any]]) -> str:
    rows = []
    for gpu in gpus:
        before = gpu.get("previous_limit", gpu.get("current_limit"))
        after = gpu.get("verified_limit", gpu.get("set_limit"))
        rows.append(
            f"<tr><td>{esc(str(gpu.get('index', '')))}</td><td><code>"
            f"{esc(str(gpu.get('uuid', '')))}</code></td>"
            f'<td class="power">{_watts(before)} → {_watts(after)}</td></tr>'
        )
    return (
        '<table class="power-limits"><tr><th>GPU</th><th>UUID</th><th>power limit</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _watts(value: Any) -> str:
    return f"{value:g} W" if isinstance(value, int | float) else "?"


def preview(step: dict[str, Any]) -> str:
    """What one upcoming step will do, from its live preview."""
    shown = step.get("preview") or {}
    parts = []
    if shown.get("state_error"):
        parts.append(f'<p class="error">live state unavailable: {esc(shown["state_error"])}</p>')
    if "evict" in shown or "pods" in shown:
        parts.append(pods_table(shown) + pdb_table(shown))
        for title, key in (("skipped", "skipped"), ("refused", "refused")):
            if shown.get(key):
                parts.append(f"<p>{title}:</p>" + _kv(shown[key]))
    found = shown.get("state")
    state: dict[str, Any] = found if isinstance(found, dict) else {}
    if isinstance(state.get("gpus"), list) and state["gpus"] and "set_limit" in state["gpus"][0]:
        parts.append(power_table(state["gpus"]))
    elif state:
        parts.append(_kv(state))
    if "already_in_place" in shown:
        parts.append(
            '<p class="muted">already in place: nothing to change</p>'
            if shown["already_in_place"]
            else ""
        )
    return "".join(parts)


def progress(output: dict[str, Any]) -> str:
    """A drain in progress (or done) as a bar: pods gone of pods to evict."""
    total = output.get("total")
    remaining = output.get("remaining")
    if not isinstance(total, int) or not isinstance(remaining, list):
        return ""
    done = max(total - len(remaining), 0)
    blocked = len(output.get("blocked") or {})
    note = f" · {blocked} blocked by a PDB" if blocked else ""
    return (
        f'<progress class="drain" max="{max(total, 1)}" value="{done if total else 1}"></progress> '
        f'<span class="drain-count">{done} of {total} pods evicted{note}</span>'
    )


# Holds that end when something happens (``guards.wait_key``), and what it is.
_WOKEN_BY = {
    "budget": "goes when a node leaves the budget, oldest first",
    "breaker": "looked at again when the breaker is reset",
}


def output(step: dict[str, Any]) -> str:
    """A step's output and error, rendered by what it holds."""
    data = step.get("output") or {}
    parts = []
    if step.get("error"):
        parts.append(f'<p class="error">{esc(step["error"])}</p>')
    if data.get("held"):
        woken = _WOKEN_BY.get(str(data.get("held_kind")))
        when = console.when(data.get("held_until"))
        again = f"{woken}, rechecked {when} at the latest" if woken else f"rechecked {when}"
        parts.append(
            f'<p><span class="badge held">held</span> {esc(str(data["held"]))} ({again})</p>'
        )
    bar = progress(data)
    if bar:
        parts.append(bar)
    if isinstance(data.get("gpus"), list) and data["gpus"] and "set_limit" in data["gpus"][0]:
        parts.append(power_table(data["gpus"]))
    if isinstance(data.get("path"), str) and "sha256" in data:
        parts.append(artifact(data))
    skip: tuple[str, ...] = (
        "held",
        "held_kind",
        "held_until",
        "gpus",
        "path",
        "sha256",
        "evicted",
        "remaining",
    )
    skip += ("gone", "blocked", "total") if bar else ()
    parts.append(_kv(data, skip=skip))
    return "".join(parts)


def artifact(data: dict[str, Any]) -> str:
    href = "/api/v1/artifacts/" + urllib.parse.quote(str(data["path"]))
    size = data.get("bytes") or data.get("size")
    extra = f" · {size} bytes" if isinstance(size, int) else ""
    return (
        f'<p class="artifact"><a href="{esc(href)}">{esc(str(data["path"]))}</a>{extra}<br>'
        f'sha256 <code class="sha256">{esc(str(data["sha256"]))}</code></p>'
    )
