"""The demo's timeline formatting: colours only when wanted, readable step summaries, drain
progress redrawn in place on a terminal only, and audit events with their chain links."""

from __future__ import annotations

import io
import json

import pytest

from remediator.demo import acts, display
from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("choice", "isatty", "environ", "expected"),
    [
        ("always", False, {}, True),
        ("always", True, {"NO_COLOR": "1"}, True),
        ("never", True, {}, False),
        ("auto", True, {}, True),
        ("auto", False, {}, False),
        ("auto", True, {"NO_COLOR": "1"}, False),
        ("auto", True, {"NO_COLOR": ""}, True),
    ],
)
def test_colour_follows_the_flag_the_terminal_and_no_color(
    choice: str, isatty: bool, environ: dict[str, str], expected: bool
) -> None:
    assert display.use_color(choice, isatty=isatty, environ=environ) is expected


def test_style_adds_escape_codes_only_when_colour_is_on() -> None:
    assert display.Style(False)("ok", "green", "bold") == "ok"
    assert display.Style(True)("ok", "green", "bold") == "\x1b[32;1mok\x1b[0m"


def test_power_cap_step_shows_the_limits_before_and_after() -> None:
    step = {
        "key": "power-cap",
        "action": "gpu.power_cap",
        "phase": "do",
        "status": "succeeded",
        "output": {
            "gpus": [{"uuid": "GPU-ff9ed5c2-6902", "previous_limit": 700.0, "set_limit": 490}]
        },
    }
    mark, text = display.step_line(step)
    assert mark == "✓"
    assert text == "power-cap [gpu.power_cap] GPU-ff9ed5c… 700 W → 490 W"


def test_undo_step_says_what_was_restored() -> None:
    step = {
        "key": "undo-power-cap",
        "action": "gpu.power_cap",
        "phase": "undo",
        "status": "succeeded",
        "output": {"restored": {"GPU-659ac159-c80d": 700.0}, "left_alone": {}},
    }
    assert display.step_line(step)[1] == (
        "undo-power-cap (undo) [gpu.power_cap] GPU-659ac15… back to 700 W"
    )


def test_waiting_step_says_it_needs_an_operator_and_a_failed_one_its_error() -> None:
    waiting = {"key": "drain", "action": "node.drain", "status": "waiting_approval", "output": {}}
    assert display.step_line(waiting) == (
        "⏸",
        "drain [node.drain] waits for an operator's approval",
    )
    failed = {
        "key": "drain",
        "action": "node.drain",
        "status": "failed",
        "error": {"message": "PDB"},
    }
    assert display.step_line(failed) == ("✗", "drain [node.drain] PDB")


def test_drain_summary_counts_evicted_pods_and_daemonsets_left() -> None:
    output = {
        "total": 2,
        "gone": ["inference/vllm-1", "research/jupyter-alice"],
        "skipped": {"gpu-operator/driver": "DaemonSet-managed: ignored"},
    }
    step = {"key": "drain", "action": "node.drain", "status": "succeeded", "output": output}
    assert display.summarize(step) == (
        "2/2 pod(s) evicted: inference/vllm-1, research/jupyter-alice; 1 DaemonSet pod(s) left"
    )


def test_a_gpu_drain_is_summarised_like_a_node_drain() -> None:
    output = {"total": 1, "gone": ["research/jupyter-alice"], "holders": ["research/jupyter-alice"]}
    step = {"action": "gpu.drain_workloads", "status": "succeeded", "output": output}
    assert display.summarize(step) == "1/1 pod(s) evicted: research/jupyter-alice"


def test_unknown_action_or_odd_output_summarises_to_nothing() -> None:
    assert (
        display.summarize({"action": "custom.thing", "status": "succeeded", "output": {"x": 1}})
        == ""
    )
    odd = {"action": "gpu.power_cap", "status": "succeeded", "output": {"gpus": 3}}
    assert display.summarize(odd) == ""


def test_progress_line_shows_a_bar_blocked_pods_and_what_remains() -> None:
    output = {
        "node": "gpu-node-02",
        "total": 4,
        "evicted": ["a/1", "a/2", "a/3"],
        "gone": ["a/1"],
        "blocked": {"b/4": {"pdb": "b/pdb"}},
        "remaining": ["a/2", "a/3", "b/4"],
    }
    assert display.progress_line(output) == (
        "draining gpu-node-02 [#####---------------] 1/4 gone, 3 evicted, 1 blocked (PDB: b/4)"
        " · waiting for a/2, a/3, b/4"
    )


def test_progress_bar_of_an_empty_drain_is_full() -> None:
    assert display.progress_bar(0, 0, width=4) == "[####]"


def _display(*, live: bool) -> tuple[display.Display, io.StringIO]:
    out = io.StringIO()
    ticks = iter(float(n) for n in range(100))
    return display.Display(out, color=False, live=live, clock=lambda: next(ticks)), out


def test_progress_is_redrawn_in_place_on_a_terminal() -> None:
    show, out = _display(live=True)
    show.progress("draining 0/1")
    show.progress("draining 0/1")
    show.progress("draining 1/1")
    show.line("done")
    text = out.getvalue()
    assert text.count("draining 0/1") == 1
    assert "\r\x1b[K" in text
    assert text.endswith("\r\x1b[Kdone\n")


def test_progress_is_a_new_line_per_change_when_not_a_terminal() -> None:
    show, out = _display(live=False)
    show.progress("draining 0/1")
    show.progress("draining 0/1")
    show.progress("draining 1/1")
    lines = out.getvalue().splitlines()
    assert [line.split("⋯ ")[1] for line in lines] == ["draining 0/1", "draining 1/1"]
    assert "\x1b" not in out.getvalue()


def test_lines_carry_the_time_since_the_demo_started() -> None:
    show, out = _display(live=False)
    show.event("⇢", "Alertmanager delivers")
    assert out.getvalue() == "[  1.0s]   ⇢ Alertmanager delivers\n"


def test_audit_event_line_names_actor_move_reason_and_chain_link() -> None:
    event = {
        "id": 54,
        "at": "2026-11-30T02:11:50.907000+00:00",
        "kind": "step.transition",
        "actor": "demo-operator",
        "fromStatus": "waiting_approval",
        "toStatus": "pending",
        "reason": "looks right",
        "data": {"key": "drain", "phase": "do"},
        "prevHash": "b404cb04aaaa",
        "hash": "d7b2878cbbbb",
    }
    assert display.event_line(event) == (
        "#54 02:11:50.907 demo-operator: step drain waiting_approval → pending “looks right” "
        "b404cb04→d7b2878c"
    )
    assert not display.attempt_start(event)
    assert display.attempt_start({**event, "fromStatus": "pending", "toStatus": "running"})


def test_intake_line_explains_deduplication() -> None:
    answer = {"status": "stored", "deliveryId": 7, "alerts": 1, "changed": 0, "deduplicated": 1}
    assert display.intake_line(answer) == (
        "stored as delivery 7: 1 alert(s), 0 changed, 1 deduplicated (same episode: nothing new)"
    )


def test_verify_line_reports_a_broken_chain() -> None:
    report = {"ok": False, "checked": 9, "firstBrokenId": 4, "reason": "hash mismatch"}
    assert display.verify_line(report) == "hash chain BROKEN at event 4: hash mismatch (9 checked)"


def test_alert_line_lists_every_alert_of_a_real_delivery() -> None:
    body = json.loads(acts.delivery_body("GPUTemperatureHigh-firing-partial-2alerts.json"))
    assert display.alert_line(body) == (
        "GPUTemperatureHigh: resolved gpu-node-01 GPU 1, firing gpu-node-01 GPU 0"
    )


def test_scenario_bodies_are_the_captured_alertmanager_bytes() -> None:
    names = {name for act in acts.SCENARIO for name in act.deliveries}
    fixtures = ROOT / "tests" / "fixtures" / "alertmanager-0.25"
    for name in names:
        assert acts.delivery_body(name) == (fixtures / name).read_bytes(), name
