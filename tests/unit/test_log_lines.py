"""A log record is one record whatever alert data its message carries: a label value cannot
forge the next line, nor act on the terminal that shows the log (move the cursor, retitle
the window, reorder the text)."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest

from remediator.app import logs

# A label value as whoever shapes the alert could send it: a forged record after a line feed,
# a window-title escape, an 8-bit CSI, a right-to-left override and a line separator.
HOSTILE = (
    "gpu-node-01\nERROR remediator.engine drained every node"
    "\x1b]0;owned\x07\x9b2J\u202eevil\u2028more"
)
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    record = logging.LogRecord("remediator.engine", logging.WARNING, "f", 1, message, args, None)
    if exc:
        try:
            raise ValueError(f"label was {HOSTILE}")
        except ValueError:
            record.exc_info = sys.exc_info()
    return record


def test_a_text_record_is_one_line_with_alert_data_escaped():
    line = logs.TextFormatter().format(_record("cordon of %s failed", HOSTILE))
    assert "\n" not in line
    assert not RAW.search(line)
    assert line == (
        "WARNING remediator.engine cordon of gpu-node-01\\x0aERROR remediator.engine drained "
        "every node\\x1b]0;owned\\x07\\x9b2J\\u202eevil\\u2028more failed"
    )


def test_a_text_records_traceback_is_indented_escaped_and_redacted():
    record = _record("step failed, token=%s", "abc", exc=True)
    lines = logs.TextFormatter().format(record).split("\n")
    assert lines[0] == "WARNING remediator.engine step failed, token=[redacted]"
    assert len(lines) > 2
    assert all(line.startswith("  ") for line in lines[1:]), "a record starts unindented"
    assert lines[1] == "  Traceback (most recent call last):"
    # The exception's own line feed goes on: indented, it cannot pass for a record.
    assert lines[-2] == "  ValueError: label was gpu-node-01"
    assert lines[-1].startswith("  ERROR remediator.engine drained every node\\x1b]0;owned")
    assert not any(RAW.search(line) for line in lines)


def test_a_json_record_escapes_what_a_terminal_acts_on_and_reads_back_exactly():
    line = logs.JsonFormatter().format(_record("cordon of %s failed", HOSTILE))
    assert "\n" not in line
    assert not RAW.search(line)
    for escape in ("\\u202e", "\\u009b", "\\u2028"):
        assert escape in line
    assert json.loads(line)["message"] == f"cordon of {HOSTILE} failed"


def test_a_json_record_keeps_other_text_as_it_is():
    line = logs.JsonFormatter().format(_record("nœud %s", "gpu-über-01 ✓"))
    assert '"nœud gpu-über-01 ✓"' in line


@pytest.mark.parametrize(
    ("fmt", "kind"), [("text", logs.TextFormatter), ("json", logs.JsonFormatter)]
)
def test_the_configured_handler_uses_the_escaping_formatter(fmt, kind):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    factory = logging.getLogRecordFactory()
    try:
        logs.configure("INFO", fmt)
        assert [type(h.formatter) for h in root.handlers] == [kind]
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.setLogRecordFactory(factory)
