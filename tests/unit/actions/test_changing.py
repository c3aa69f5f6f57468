"""A failure once a change may have reached the cluster says so (``maybe_applied``)."""

from __future__ import annotations

import pytest

from remediator.actions import clusterops
from remediator.domain import errors
from remediator.ports import cluster as port


def test_a_lost_answer_inside_a_change_is_temporary_and_maybe_applied() -> None:
    lost = port.Unavailable("patch node n1: ServerDisconnectedError", retry_after=2.0)
    with pytest.raises(errors.ActionFailed) as info, clusterops.changing({"node": "n1"}):
        raise lost
    assert info.value.temporary is True
    assert info.value.retry_after == 2.0
    assert info.value.output == {"node": "n1", "maybe_applied": True}
    assert info.value.__cause__ is lost


def test_what_undo_needs_is_read_when_the_failure_happens() -> None:
    previous: dict[str, str] = {}

    def set_then_lose_the_read_back() -> None:
        with clusterops.changing(lambda: {"previous": dict(previous)}):
            previous["gpu"] = "650"
            raise errors.ActionFailed("read-back dropped", temporary=True, output={"at": "verify"})

    with pytest.raises(errors.ActionFailed) as info:
        set_then_lose_the_read_back()
    assert info.value.output == {"previous": {"gpu": "650"}, "maybe_applied": True, "at": "verify"}


def test_a_failure_that_knows_nothing_was_changed_keeps_saying_so() -> None:
    refused = errors.ActionFailed("refused", output={"maybe_applied": False})
    with pytest.raises(errors.ActionFailed) as info, clusterops.changing({"node": "n1"}):
        raise refused
    assert info.value is refused
    assert info.value.output["maybe_applied"] is False
    assert info.value.temporary is False
