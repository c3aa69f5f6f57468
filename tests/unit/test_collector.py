"""The garbage collector of ``remediator serve``, settled once start-up is done."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from remediator import cli


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector")
def test_start_up_objects_are_frozen_and_young_ones_collected_ten_times_less_often():
    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])  # Python's default
    built = [object() for _ in range(10)], {"a": []}  # tracked: a list and a dict
    cli.settle_collector()
    assert gc.get_freeze_count() > 0
    collected = {id(x) for x in gc.get_objects()}  # the frozen are out of its sight
    assert all(gc.is_tracked(x) and id(x) not in collected for x in built)
    assert gc.get_threshold() == (cli.YOUNG_COLLECTION, *before[1:])
    assert cli.YOUNG_COLLECTION >= 10 * 700
