"""Text from alerts shown to people: escaped where a terminal would act on it, and kept a
text cell where a spreadsheet would read it as a formula."""

from __future__ import annotations

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


@given(st.text())
def test_one_quote_taken_from_a_quoted_cell_gives_the_text_back(text):
    cell = terminal.spreadsheet_cell(text)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
    assert (cell[1:] if cell.startswith("'") else cell) == text


@given(st.text())
def test_one_line_is_one_line_and_printable_keeps_only_line_feeds(text):
    assert "\n" not in terminal.one_line(text)
    assert "\x1b" not in terminal.printable(text)
    assert terminal.printable(text).count("\n") == text.count("\n")
