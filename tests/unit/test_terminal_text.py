"""Text from alerts shown to people: escaped where a terminal would act on it, and kept a
text cell where a spreadsheet would read it as a formula."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediator.domain import terminal


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        (
            '=HYPERLINK("http://evil.example","x") fired',
            '\'=HYPERLINK("http://evil.example","x") fired',
        ),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1:A2)", "'@SUM(A1:A2)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("'quoted", "''quoted"),
        ("GPUXidError79 fired", "GPUXidError79 fired"),
        ('{"node": "=x"}', '{"node": "=x"}'),
        ("", ""),
    ],
)
def test_a_cell_a_spreadsheet_would_compute_is_kept_text(text, cell):
    assert terminal.spreadsheet_cell(text) == cell


# Text with the characters that matter drawn often, among any others.
TEXT = st.text(
    st.sampled_from(list("a=+-@'\t\r\n\x00\x1b\x7f\x9b\u2028\u202e\u2066")) | st.characters()
)
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")


@given(TEXT)
def test_one_quote_taken_from_a_quoted_cell_gives_the_text_back(text):
    cell = terminal.spreadsheet_cell(text)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
    assert (cell[1:] if cell.startswith("'") else cell) == text


@given(TEXT)
def test_one_line_is_one_line_and_printable_keeps_only_line_feeds(text):
    line = terminal.one_line(text)
    assert "\n" not in line
    assert not UNSAFE.search(line)
    shown = terminal.printable(text)
    assert not UNSAFE.search(shown)
    assert shown.count("\n") == text.count("\n")
    assert terminal.has_unsafe(text) == (shown != text)


@given(st.dictionaries(TEXT, TEXT, max_size=3))
def test_json_made_printable_is_the_same_json_value(value):
    encoded = terminal.json_printable(json.dumps(value, ensure_ascii=False))
    assert not UNSAFE.search(encoded)
    assert json.loads(encoded) == value
