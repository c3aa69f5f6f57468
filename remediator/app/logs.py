"""Structured logs: one JSON object per line (or plain text for a terminal), with secrets
redacted from every line. Alert data in a record can neither forge another record nor act on
the terminal showing the log: JSON escapes line feeds and control characters, and escapes
the bidirectional controls here too; the text format escapes them itself (``TextFormatter``).

Redaction happens where a record is made (``logging.setLogRecordFactory``), so every handler
sees the redacted record, including handlers that libraries or test harnesses add: the
message is formatted with its args, redacted, and its args dropped; an exception's text and a
stack are formatted and redacted at once. A filter on the root handler redacts again, and also
the ``extra`` fields (aiohttp's access log puts the request line there), which are set after
the record is made. This covers aiohttp's own loggers (``aiohttp.server`` logs a malformed
request with the raw header bytes), httpx and kubernetes_asyncio alike.

What is redacted: Bearer/Basic credentials, ``Authorization``, ``Cookie`` and ``Set-Cookie``
header values, ``name=value`` pairs and quoted ``"name": "value"`` pairs whose name mentions a
token, password, secret, session, csrf or API key, the password of a URL, and the exact values
registered with ``add_secrets`` (the tokens of the tokens file, the session secret).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from remediator.domain import terminal

REDACTED = "[redacted]"

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

_SENSITIVE_KEY = (
    r"[A-Za-z0-9_.-]*(?:token|passw(?:or)?d|secret|session|csrf|api[_-]?key)[A-Za-z0-9_.-]*"
)
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Header lines, wherever they appear: a raw request in a parser error, a dict of headers.
    (
        re.compile(r"(?i)((?:proxy-)?authorization|(?:set-)?cookie)(['\"]?\s*[:=]\s*)[^\r\n]*"),
        rf"\1\2{REDACTED}",
    ),
    (re.compile(r"(?i)\b(bearer)(\s+)[^\s'\",;]+"), rf"\1\2{REDACTED}"),
    (
        re.compile(r"\b(Basic|BASIC|basic)(\s+)[A-Za-z0-9+/]{16,}={0,2}(?![\w+/=])"),
        rf"\1\2{REDACTED}",
    ),
    (
        re.compile(rf"(?i)(['\"]{_SENSITIVE_KEY}['\"]\s*:\s*)(['\"])(?:(?!\2).)*\2"),
        rf"\1\2{REDACTED}\2",
    ),
    (re.compile(rf"(?i)\b({_SENSITIVE_KEY})=[^&\s'\",;]+"), rf"\1={REDACTED}"),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)[^@\s/'\"]+@"), rf"\1{REDACTED}@"),
]


class Redactor:
    """Replaces credentials in text; ``add`` registers exact secret values (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._exact: re.Pattern[str] | None = None

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            self._values |= {value for value in values if value and len(value) >= 8}
            ordered = sorted(self._values, key=len, reverse=True)
            self._exact = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._exact = None

    def __call__(self, text: str) -> str:
        exact = self._exact
        if exact is not None:
            text = exact.sub(REDACTED, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def value(self, value: Any) -> Any:
        """Redact strings inside ``extra`` values (strings, dicts, lists, tuples)."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.value(item) for item in value)
        return value


redact = Redactor()


def add_secrets(values: Iterable[str]) -> None:
    """Known secret values (exact) to redact from every log line from now on."""
    redact.add(values)


def _redact_record(record: logging.LogRecord, formatter: logging.Formatter) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a broken format: log the bare message, never the args unredacted
        message = str(record.msg)
    record.msg, record.args = redact(message), ()
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """Redacts a record in place: message, args, exception text, stack and ``extra`` fields."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record, self._formatter)
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD:
                record.__dict__[key] = redact.value(value)
        return True


def _redacting_factory(base: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    formatter = logging.Formatter()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        _redact_record(record, formatter)
        return record

    factory.redacting = True  # type: ignore[attr-defined]
    return factory


def install_redaction() -> None:
    """Make every log record redacted where it is made (idempotent)."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "redacting", False):
        logging.setLogRecordFactory(_redacting_factory(current))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        entry |= {k: redact.value(v) for k, v in record.__dict__.items() if k not in _STANDARD}
        if record.exc_info or record.exc_text:
            text = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
            entry["exception"] = redact(text)
        return terminal.json_printable(json.dumps(entry, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """``LEVEL logger message``, one line a record whatever the message holds: its line feeds
    and the characters a terminal acts on are escaped (``domain.terminal``), so alert data in
    a message can neither forge a record nor take over the terminal showing the log. An
    exception's traceback follows on lines of its own, each indented, escaped the same way:
    a line that starts a record is never indented."""

    def format(self, record: logging.LogRecord) -> str:
        line = terminal.one_line(f"{record.levelname} {record.name} {redact(record.getMessage())}")
        if record.exc_info or record.exc_text:
            line += _indented(record.exc_text or self.formatException(record.exc_info))  # type: ignore[arg-type]
        if record.stack_info:
            line += _indented(record.stack_info)
        return line


def _indented(text: str) -> str:
    """``text`` redacted and escaped, each of its lines after a line feed and two spaces."""
    return "".join(f"\n  {part}" for part in terminal.printable(redact(text)).splitlines())


def configure(level: str = "INFO", fmt: str = "json") -> None:
    install_redaction()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
