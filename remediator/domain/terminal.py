"""Text from alerts on its way to a terminal, a log line or a spreadsheet.

Label values are chosen by whoever shapes the alert, and intake stores them as they came (only
NUL is refused). Where such text is shown, what could act instead of being read is escaped:

- control characters (C0 and C1), the line and paragraph separators (U+2028, U+2029) and the
  bidirectional overrides, embeddings and isolates (U+202A-U+202E, U+2066-U+2069) could move
  the cursor, clear the screen, retitle the window or reorder what a person reads: they are
  written as ``\\x1b``, ``\\u202e``;
- a line feed in one log record's message could forge the next record: a record's message is
  one line;
- a spreadsheet cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is
  read as a formula (OWASP's "CSV injection"): such a text cell gets a leading ``'``, and so
  does one that starts with ``'`` already, so that one ``'`` taken from every cell starting
  with it gives the text back exactly.
"""

from __future__ import annotations

import re

# What JSON leaves raw (``json.dumps(..., ensure_ascii=False)``): DEL and C1, the line and
# paragraph separators and the bidirectional controls; JSON escapes C0 itself.
_BEYOND_C0 = "\x7f-\x9f\u2028-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x09\x0b-\x1f{_BEYOND_C0}]")  # (the line feed kept)
_UNSAFE_OR_NEWLINE = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
_UNSAFE_IN_JSON = re.compile(f"[{_BEYOND_C0}]")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def _escaped(found: re.Match[str]) -> str:
    code = ord(found[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def has_unsafe(text: str) -> bool:
    """Whether ``printable`` would change ``text``."""
    return _UNSAFE.search(text) is not None


def printable(text: str) -> str:
    """``text`` with its control characters (line feeds kept) and bidirectional controls
    escaped."""
    return _UNSAFE.sub(_escaped, text)


def one_line(text: str) -> str:
    """``printable``, line feeds escaped too (``\\x0a``): one line whatever ``text`` holds."""
    return _UNSAFE_OR_NEWLINE.sub(_escaped, text)


def json_printable(encoded: str) -> str:
    """JSON text (``json.dumps`` with ``ensure_ascii=False``) with the characters it leaves
    raw that a terminal acts on written as JSON escapes (``\\u009b``, ``\\u202e``): the same
    JSON value, safe to show."""
    return _UNSAFE_IN_JSON.sub(lambda found: f"\\u{ord(found[0]):04x}", encoded)


def spreadsheet_cell(text: str) -> str:
    """``text`` as a spreadsheet reads it as text, never as a formula (see the module's
    docstring)."""
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text
