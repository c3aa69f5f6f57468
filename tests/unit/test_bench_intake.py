"""The intake benchmark measures the two servers in alternating turns, so a machine whose
speed drifts favours neither, and combines the turns without flattering them."""

from __future__ import annotations

import pathlib

import pytest

from bench import intake


def test_turns_alternate_and_reverse_each_round(monkeypatch: pytest.MonkeyPatch, tmp_path):
    calls: list[tuple[str, float]] = []
    # A machine that slows down steadily: each wrk run is 100/s slower than the one before.
    speed = {"now": 10_000.0}

    def wrk(url: str, workdir: pathlib.Path, seconds: float) -> intake.WrkResult:
        calls.append((url, seconds))
        speed["now"] -= 100
        return intake.WrkResult(rate=speed["now"], p50=0.001, p99=0.01, errors=0)

    monkeypatch.setattr(intake, "wrk", wrk)
    ours, bare = intake.alternating(["ours", "bare"], tmp_path, 40, rounds=4)

    timed = [(url, seconds) for url, seconds in calls if seconds != 1]  # past the warm-ups
    assert [url for url, _ in timed] == ["ours", "bare", "bare", "ours"] * 2
    assert {seconds for _, seconds in timed} == {10}
    # The same machine for both: a steady slowdown costs neither more than the other.
    assert ours.rate == bare.rate


def test_turns_combine_to_the_mean_rate_and_the_worst_percentiles():
    turns = [
        intake.WrkResult(rate=1000, p50=0.002, p99=0.010, errors=0),
        intake.WrkResult(rate=2000, p50=0.004, p99=0.030, errors=2),
        intake.WrkResult(rate=3000, p50=0.003, p99=0.020, errors=1),
    ]
    got = intake.combined(turns)
    assert got.rate == 2000
    assert (got.p50, got.p99) == (0.004, 0.030)
    assert got.errors == 3
