"""The one table ``make bench`` prints: rows of (measure, backend, value, target, note), plus
the percentile arithmetic every latency figure goes through."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Row:
    measure: str
    backend: str
    value: str
    target: str = ""
    note: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks; NaN for no
    values. The same definition as numpy's default, so figures compare across tools."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> str:
    """Seconds as milliseconds for the table ("-" when unknown)."""
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:,.0f}" if seconds >= 0.1 else f"{seconds * 1000:.1f}"


def latencies(values: Sequence[float]) -> str:
    """``p50 / p90 / p99 ms`` of latencies in seconds."""
    return " / ".join(ms(percentile(values, q)) for q in (50, 90, 99)) + " ms"


def ratio(numerator: float, denominator: float) -> str:
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return "-"
    return f"{numerator / denominator:.2f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: Iterable[Row], *, title: str = "") -> str:
    """A Markdown table (GitHub flavour); cells with a ``|`` are escaped."""
    header = ["measure", "backend", "measured", "target", "note"]
    lines = [f"### {title}", ""] if title else []
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|---|---|---:|---|---|")
    for row in rows:
        cells = [row.measure, row.backend, row.value, row.target, row.note]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)
