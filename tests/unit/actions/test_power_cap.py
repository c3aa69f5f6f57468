"""Power cap targets: computed from the default limit, within [min, max], parsed by position."""

from __future__ import annotations

import dataclasses

import pytest

from remediator.actions import gpu

H200 = gpu.GpuLimits(
    index=0,
    uuid="GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881",
    pci_bus_id="00000000:18:00.0",
    limit=450.0,
    default=700.0,
    min=200.0,
    max=700.0,
    enforced=450.0,
)


def test_percent_is_taken_from_the_default_limit_not_the_current_one() -> None:
    assert gpu.compute_target(H200, watts=None, percent=50, clamp=True) == (350.0, False)


def test_percent_below_the_minimum_is_clamped_to_the_minimum() -> None:
    assert gpu.compute_target(H200, watts=None, percent=10, clamp=True) == (200.0, True)


def test_watts_outside_the_range_are_refused_unless_clamping() -> None:
    with pytest.raises(ValueError, match="outside the power limit range 200-700 W"):
        gpu.compute_target(H200, watts=800, percent=None, clamp=False)
    assert gpu.compute_target(H200, watts=800, percent=None, clamp=True) == (700.0, True)


def test_clamp_defaults_to_true_for_percent_and_false_for_watts() -> None:
    assert gpu.PowerCapParams(percent_of_default=50).clamping is True
    assert gpu.PowerCapParams(watts=300).clamping is False


def test_query_output_is_parsed_by_position_and_not_supported_rows_fail() -> None:
    text = (
        "0, GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881, 00000000:18:00.0, 700.00, 700.00, "
        "200.00, 700.00, 700.00\n"
        "Unable to determine the device handle for GPU0000:28:00.0: Unknown Error\n"
    )
    [parsed] = gpu.parse_query(text)
    assert parsed.limit == 700.0
    assert parsed.min == 200.0
    with pytest.raises(ValueError, match="does not report power limits"):
        gpu.parse_query("1, GPU-x, 00000000:28:00.0, [N/A], 700.00, 200.00, 700.00, [N/A]\n")


def test_gpus_are_selected_by_index_uuid_or_bus_id() -> None:
    assert gpu.select([H200], ["0"]) == [H200]
    assert gpu.select([H200], [H200.uuid.upper()]) == [H200]
    assert gpu.select([H200], ["0000:18:00.0"]) == [H200]


def test_undo_restores_only_limits_still_at_what_we_set() -> None:
    ours = {"uuid": H200.uuid, "previous_limit": 700.0, "set_limit": 450.0}
    assert gpu.undo_plan([H200], [ours]) == ([(H200.uuid, 700.0)], {})
    theirs = {"uuid": H200.uuid, "previous_limit": 700.0, "set_limit": 350.0}
    restore, left = gpu.undo_plan([H200], [theirs])
    assert restore == []
    assert left == {H200.uuid: "limit changed by someone else to 450 W"}


def test_undo_with_nothing_on_record_restores_the_default_only_from_the_cap_target() -> None:
    capped = dataclasses.replace(H200, limit=350.0)
    assert gpu.undo_plan([capped], [], {H200.uuid: 350.0}) == ([(H200.uuid, 700.0)], {})
    restore, left = gpu.undo_plan([H200], [], {H200.uuid: 350.0})
    assert restore == []
    assert left == {H200.uuid: "limit changed by someone else to 450 W"}
    assert gpu.undo_plan([capped], [], {}) == ([], {})  # not a GPU this cap targets


def test_a_retry_keeps_the_previous_limit_only_of_gpus_still_at_the_earlier_cap() -> None:
    earlier = {
        "maybe_applied": True,
        "gpus": [{"uuid": H200.uuid, "previous_limit": 600.0, "set_limit": 450.0}],
    }
    assert gpu.kept_previous(earlier, [H200]) == {H200.uuid: 600.0}
    moved = dataclasses.replace(H200, limit=500.0)  # changed since: read it as it is now
    assert gpu.kept_previous(earlier, [moved]) == {}
    assert gpu.kept_previous({"gpus": earlier["gpus"]}, [H200]) == {}  # a success: not a retry


def test_watts_are_passed_to_nvidia_smi_without_needless_decimals() -> None:
    assert gpu.watts_arg(350.0) == "350"
    assert gpu.watts_arg(350.5) == "350.50"
