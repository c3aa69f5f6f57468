"""Human durations in playbooks and settings: ``90s``, ``10m``, ``1h30m``, ``2d`` or seconds."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

import pydantic

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        if text and _PART.sub("", text) == "":
            seconds = sum(float(num) * _UNITS[unit] for num, unit in _PART.findall(text))
            return dt.timedelta(seconds=seconds)
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return dt.timedelta(seconds=float(text))
        if text.startswith(("P", "-P")):
            return text  # ISO 8601, as pydantic serialises durations
        raise ValueError(f"invalid duration {value!r}; use e.g. 30s, 10m, 1h30m")
    return value


Duration = Annotated[dt.timedelta, pydantic.BeforeValidator(parse_duration)]


def format_duration(value: dt.timedelta) -> str:
    """``value`` as ``parse_duration`` reads it back: ``15s``, ``5m``, ``1h30m``, ``0s``."""
    milliseconds = round(value.total_seconds() * 1000)
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = round(_UNITS[unit] * 1000)
        count, milliseconds = divmod(milliseconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
