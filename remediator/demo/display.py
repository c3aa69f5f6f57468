"""The demo's timeline: alert → playbook → steps → outcome, approvals, drain progress, checks
and the audit trail. Formatting is pure (strings in, strings out); ``Display`` writes them with
the time since the demo started, in colour only when asked or when stdout is a terminal and
``NO_COLOR`` is unset, and redraws the progress line in place only on a terminal."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}

STATUS_MARKS = {
    "succeeded": ("✓", "green"),
    "failed": ("✗", "red"),
    "rejected": ("✗", "red"),
    "cancelled": ("-", "yellow"),
    "skipped": ("-", "dim"),
    "undone": ("↺", "cyan"),
    "waiting_approval": ("⏸", "yellow"),
    "running": ("…", "blue"),
    "pending": ("·", "dim"),
}


def use_color(choice: str, *, isatty: bool, environ: Mapping[str, str] | None = None) -> bool:
    """``always``/``never`` decide; ``auto`` colours a terminal unless NO_COLOR is set."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    env = os.environ if environ is None else environ
    return isatty and not env.get("NO_COLOR")


class Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *names: str) -> str:
        if not self.color or not names:
            return text
        codes = ";".join(_CODES[name] for name in names)
        return f"\x1b[{codes}m{text}\x1b[0m"


def short(value: str, length: int = 12) -> str:
    return value if len(value) <= length else value[: length - 1] + "…"


def watts(value: Any) -> str:
    return f"{float(value):g} W" if isinstance(value, int | float) else "?"


# ---- what a step did, in a few words ---------------------------------------------------------


def _power_cap(output: dict[str, Any]) -> str:
    parts = [
        f"{short(str(g.get('uuid', '?')))} {watts(g.get('previous_limit'))} → "
        f"{watts(g.get('set_limit'))}"
        for g in output.get("gpus") or []
    ]
    return ", ".join(parts) or "no GPU changed"


def _power_restore(output: dict[str, Any]) -> str:
    restored = output.get("restored") or {}
    parts = [f"{short(uuid)} back to {watts(limit)}" for uuid, limit in restored.items()]
    parts += [
        f"{short(uuid)} left alone ({why})"
        for uuid, why in (output.get("left_alone") or {}).items()
    ]
    return ", ".join(parts) or "nothing to restore"


def _drain(output: dict[str, Any]) -> str:
    gone = output.get("gone") or []
    text = f"{len(gone)}/{output.get('total', len(gone))} pod(s) evicted"
    if gone:
        text += ": " + ", ".join(gone)
    skipped = output.get("skipped") or {}
    if skipped:
        text += f"; {len(skipped)} DaemonSet pod(s) left"
    return text


def _bug_report(output: dict[str, Any]) -> str:
    mode = " (safe mode)" if output.get("safe_mode") else ""
    return (
        f"{output.get('path', '?')}{mode}, {output.get('size', '?')} bytes, "
        f"sha256 {str(output.get('sha256', '?'))[:12]}"
    )


def _notify(output: dict[str, Any]) -> str:
    where = "sent" if output.get("delivered") else "logged (no channel configured)"
    return f"{where}: {short(str(output.get('message', '')), 90)}"


def _annotate(output: dict[str, Any]) -> str:
    pod = output.get("pod") or output.get("name") or "?"
    namespace = output.get("namespace")
    target = f"{namespace}/{pod}" if namespace else str(pod)
    keys = output.get("set") or output.get("annotations") or output.get("restored") or {}
    return f"{target} {', '.join(keys) if keys else ''}".strip()


def _label(output: dict[str, Any]) -> str:
    labels = output.get("set") or {}
    return ", ".join(f"{k}={v}" for k, v in labels.items()) or "labels in place"


def _taint(output: dict[str, Any]) -> str:
    taints = output.get("added") or []
    text = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in taints)
    return text or "taints in place"


_SUMMARIES: dict[tuple[str, str], Callable[[dict[str, Any]], str]] = {
    ("gpu.power_cap", "do"): _power_cap,
    ("gpu.power_cap", "undo"): _power_restore,
    ("node.drain", "do"): _drain,
    ("gpu.drain_workloads", "do"): _drain,
    ("gpu.collect_bug_report", "do"): _bug_report,
    ("notify", "do"): _notify,
    ("pod.annotate", "do"): _annotate,
    ("pod.annotate", "undo"): lambda o: "annotation removed",
    ("node.cordon", "do"): lambda o: f"{o.get('node', '?')} unschedulable",
    ("node.label", "do"): _label,
    ("node.taint", "do"): _taint,
    ("k8s.event", "do"): lambda o: f"Event {o.get('event') or o.get('name') or ''}".strip(),
}


def summarize(step: dict[str, Any]) -> str:
    """A few words on what a finished step did (its error when it failed)."""
    if step.get("status") == "waiting_approval":
        return "waits for an operator's approval"
    if step.get("status") in ("pending", "running"):
        return ""
    if step.get("error"):
        error = step["error"]
        return short(str(error.get("message", error) if isinstance(error, dict) else error), 100)
    output = step.get("output") or {}
    if not isinstance(output, dict):
        return ""
    summary = _SUMMARIES.get((str(step.get("action")), str(step.get("phase", "do"))))
    try:
        return summary(output) if summary else ""
    except (TypeError, ValueError, AttributeError):
        return ""


# ---- lines -----------------------------------------------------------------------------------


def alert_line(body: dict[str, Any]) -> str:
    """``GPUTemperatureHigh: firing gpu-node-01 GPU 1, firing gpu-node-01 GPU 0``."""
    alerts = body.get("alerts") or []
    names = sorted({str(a.get("labels", {}).get("alertname", "?")) for a in alerts})
    parts = []
    for alert in alerts:
        labels = alert.get("labels", {})
        where = labels.get("node") or labels.get("Hostname") or labels.get("instance") or "?"
        gpu = f" GPU {labels['gpu']}" if "gpu" in labels else ""
        parts.append(f"{alert.get('status', '?')} {where}{gpu}")
    return f"{', '.join(names)}: {', '.join(parts)}"


def intake_line(answer: dict[str, Any]) -> str:
    text = (
        f"{answer.get('status', '?')} as delivery {answer.get('deliveryId', '?')}: "
        f"{answer.get('alerts', 0)} alert(s), {answer.get('changed', 0)} changed"
    )
    if answer.get("deduplicated"):
        text += f", {answer['deduplicated']} deduplicated (same episode: nothing new)"
    return text


def run_line(run: dict[str, Any]) -> str:
    gpu = f" ({short(str(run['gpu']), 13)})" if run.get("gpu") else ""
    return (
        f"run #{run['id']} playbook {run['playbook']} on {run.get('node') or '(no node)'}{gpu}"
        f" — {run.get('reason') or run.get('kind', '')}"
    )


def step_line(step: dict[str, Any]) -> tuple[str, str]:
    """(mark, text) for a step that reached a status worth telling."""
    mark, _ = STATUS_MARKS.get(str(step.get("status")), ("?", "dim"))
    undo = " (undo)" if step.get("phase") == "undo" else ""
    summary = summarize(step)
    text = f"{step.get('key', '?')}{undo} [{step.get('action', '?')}]"
    return mark, f"{text} {summary}".rstrip() if summary else text


def progress_bar(done: int, total: int, width: int = 20) -> str:
    filled = width if total <= 0 else round(width * min(done, total) / total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def progress_line(output: dict[str, Any]) -> str:
    """Drain progress from the running step's saved output."""
    total = int(output.get("total") or 0)
    gone = len(output.get("gone") or [])
    evicted = len(output.get("evicted") or [])
    blocked = output.get("blocked") or {}
    remaining = output.get("remaining") or []
    text = (
        f"draining {output.get('node', '?')} {progress_bar(gone, total)} {gone}/{total} gone, "
        f"{evicted} evicted, {len(blocked)} blocked"
    )
    if blocked:
        text += " (PDB: " + ", ".join(sorted(blocked)) + ")"
    if remaining:
        text += " · waiting for " + ", ".join(remaining)
    return text


def event_line(event: dict[str, Any]) -> str:
    """One audit event: id, time, actor, what moved, why, and its place in the hash chain."""
    at = str(event.get("at", ""))[11:23]
    data = event.get("data") or {}
    subject = "run" if str(event.get("kind", "")).startswith("run") else "step"
    if subject == "step" and data.get("key"):
        subject = f"step {data['key']}" + (" (undo)" if data.get("phase") == "undo" else "")
    moved = f"{event.get('fromStatus') or '∅'} → {event.get('toStatus') or '∅'}"
    if not event.get("fromStatus") and not event.get("toStatus"):
        moved = str(event.get("kind", ""))
    reason = f" “{short(str(event['reason']), 60)}”" if event.get("reason") else ""
    chain = f"{str(event.get('prevHash') or '')[:8]}→{str(event.get('hash') or '')[:8]}"
    return f"#{event.get('id')} {at} {event.get('actor', '?')}: {subject} {moved}{reason} {chain}"


def attempt_start(event: dict[str, Any]) -> bool:
    """A step's ``pending → running`` record (the intent before the effect)."""
    return (
        event.get("kind") == "step.transition"
        and event.get("fromStatus") == "pending"
        and event.get("toStatus") == "running"
    )


def verify_line(report: dict[str, Any]) -> str:
    if report.get("ok"):
        return f"hash chain intact: {report.get('checked')} event(s) verified"
    return (
        f"hash chain BROKEN at event {report.get('firstBrokenId')}: {report.get('reason')} "
        f"({report.get('checked')} checked)"
    )


class Display:
    """Writes the timeline to ``out``; ``live`` redraws the progress line in place."""

    def __init__(
        self,
        out: TextIO,
        *,
        color: bool,
        live: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.style = Style(color)
        self.live = live
        self.clock = clock
        self.started = clock()
        self._progress: str | None = None

    def _stamp(self) -> str:
        return self.style(f"[{self.clock() - self.started:5.1f}s]", "dim")

    def _write(self, text: str) -> None:
        if self._progress is not None and self.live:
            self.out.write("\r\x1b[K")
        self._progress = None
        self.out.write(text + "\n")
        self.out.flush()

    def line(self, text: str = "", *, stamp: bool = False, indent: int = 0) -> None:
        prefix = f"{self._stamp()} " if stamp else ""
        self._write(prefix + " " * indent + text)

    def heading(self, text: str) -> None:
        self._write("")
        self._write(self.style(text, "bold"))

    def act(self, number: int, title: str, story: str) -> None:
        self._write("")
        self._write(
            self.style(f"── {number}. {title} ", "bold", "cyan") + self.style("─" * 30, "cyan")
        )
        self._write(self.style(story, "dim"))

    def event(self, mark: str, text: str, *, color: str = "", indent: int = 2) -> None:
        colors = (color,) if color else ()
        self.line(f"{self.style(mark, *colors)} {text}", stamp=True, indent=indent)

    def step(self, run_id: int, step: dict[str, Any]) -> None:
        mark, text = step_line(step)
        _, color = STATUS_MARKS.get(str(step.get("status")), ("?", "dim"))
        self.event(mark, f"{self.style(f'#{run_id}', 'dim')} {text}", color=color, indent=6)

    def progress(self, text: str) -> None:
        """Show drain progress: redrawn in place on a terminal, a new line when it changes."""
        if text == self._progress:
            return
        line = f"{self._stamp()}       {self.style('⋯', 'blue')} {text}"
        if self.live:
            self.out.write("\r\x1b[K" + line)
            self.out.flush()
        else:
            self.out.write(line + "\n")
            self.out.flush()
        self._progress = text

    def check(self, ok: bool, text: str, detail: str = "") -> None:
        mark = self.style("✓", "green") if ok else self.style("✗", "red", "bold")
        suffix = f" — {detail}" if detail and not ok else ""
        self.line(f"{mark} check: {text}{suffix}", stamp=True, indent=2)
