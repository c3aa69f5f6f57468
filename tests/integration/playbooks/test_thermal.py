"""gpu-temperature-high and gpu-temperature-critical against the simulator."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.sim import testing
from tests.conftest import am_payload
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    approve,
    body,
    cordoned,
    fixture,
    node_events,
    only_run,
    pod_uids,
    post,
    statuses,
    step,
)

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-node-01"
CAPPED = 490.0  # 70 % of the H100's 700 W default, above its 200 W minimum
DEFAULT = 700.0
ZERO = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


async def test_temperature_high_caps_each_hot_gpu_and_restores_each_when_it_cools(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    h = await gpu_harness()
    gpu0, gpu1 = sim.gpu(NODE, 0), sim.gpu(NODE, 1)
    await post(h, fixture("GPUTemperatureHigh-firing-2alerts"))
    runs = await h.runs(playbook="gpu-temperature-high")
    assert sorted(r["status"] for r in runs) == ["succeeded", "succeeded"]
    assert sorted(r["gpu"] for r in runs) == sorted([gpu0.uuid, gpu1.uuid])
    assert (gpu0.power_limit, gpu1.power_limit) == (CAPPED, CAPPED)
    assert sim.gpu(NODE, 2).power_limit == DEFAULT  # only the hot GPUs
    assert not cordoned(sim, NODE)
    reasons = node_events(sim, NODE)
    assert reasons.count("RemediatorPowerCap") == 2
    assert reasons.count("GPUThermalPowerCap") == 2
    assert len(notifier.sent) == 2
    assert all("capped to 70%" in m for m in notifier.messages())

    detail = await h.run_detail(next(r["id"] for r in runs if r["gpu"] == gpu0.uuid))
    [record] = step(detail, "power-cap")["output"]["gpus"]
    assert record | {"previous_limit": 700.0, "set_limit": CAPPED} == record
    caps = [e for e in detail["events"] if e["toStatus"] == "succeeded" and e["stepId"]]
    assert len(caps) == 3  # power-cap, event, notify each audited

    # GPU 1 cools down first (a partially resolved group), then GPU 0.
    await post(h, fixture("GPUTemperatureHigh-firing-partial-2alerts"))
    assert (gpu0.power_limit, gpu1.power_limit) == (CAPPED, DEFAULT)
    await post(h, fixture("GPUTemperatureHigh-resolved-1alerts"))
    assert (gpu0.power_limit, gpu1.power_limit) == (DEFAULT, DEFAULT)
    undo_runs = await h.runs(kind="undo")
    assert sorted(r["status"] for r in undo_runs) == ["succeeded", "succeeded"]
    detail = await h.run_detail(detail["id"])
    assert statuses(detail) == {"power-cap": "undone", "event": "succeeded", "notify": "succeeded"}
    assert "RemediatorPowerRestore" in node_events(sim, NODE)


async def test_a_refire_of_temperature_high_does_not_stack_caps(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier, clock: Any
) -> None:
    h = await gpu_harness()
    first = fixture("GPUTemperatureHigh-firing-2alerts")
    await post(h, first)
    # The resolution never reached us; the same alert fires again as a new episode, within
    # the cooldown (no new run) and after it (a run that finds the cap in place).
    again = first.replace(b"2026-11-30T00:01:55.47Z", b"2026-11-30T00:11:55.47Z")
    clock.advance(10 * 60)
    await post(h, again)
    assert len(await h.runs(playbook="gpu-temperature-high")) == 2
    again = first.replace(b"2026-11-30T00:01:55.47Z", b"2026-11-30T00:31:55.47Z")
    clock.advance(20 * 60)
    await post(h, again)
    runs = await h.runs(playbook="gpu-temperature-high")
    assert len(runs) == 4
    assert sim.gpu(NODE, 0).power_limit == CAPPED  # 70 % of the default, not of 490 W
    newest = await h.run_detail(max(r["id"] for r in runs))
    assert step(newest, "power-cap")["output"]["already_in_place"] is True
    # Each suppressed re-fire was told to on-call once, with the reason.
    suppressed = [s for s in notifier.sent if s["data"].get("event") == "suppressed"]
    assert sorted(s["data"]["reason"] for s in suppressed) == sorted(
        f"playbook gpu-temperature-high is cooling down on node {NODE}, GPU {sim.gpu(NODE, i).uuid}"
        for i in (0, 1)
    )


async def test_a_gpu_that_overheats_again_within_the_cooldown_is_capped_again_and_told(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier, clock: Any
) -> None:
    h = await gpu_harness()
    gpu1 = sim.gpu(NODE, 1)
    await post(h, fixture("GPUTemperatureHigh-firing-2alerts"))
    await post(h, fixture("GPUTemperatureHigh-firing-partial-2alerts"))  # GPU 1 cooled down
    assert gpu1.power_limit == DEFAULT
    told = len(notifier.sent)

    clock.advance(5 * 60)  # GPU 1 is hot again, a new episode within the 15-minute cooldown
    payload = am_payload("GPUTemperatureHigh-firing-partial-2alerts")
    again = next(a for a in payload["alerts"] if a["labels"]["gpu"] == "1")
    again |= {"status": "firing", "startsAt": "2026-11-30T00:07:01.47Z", "endsAt": ZERO}
    await post(h, body(payload))
    assert gpu1.power_limit == CAPPED
    assert len(notifier.sent) == told + 1


async def test_temperature_critical_caps_cordons_drains_after_approval_and_undoes_on_resolve(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    h = await gpu_harness()
    before = pod_uids(sim, NODE)
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-temperature-critical")
    assert detail["status"] == "waiting_approval", statuses(detail)
    assert step(detail, "drain")["status"] == "waiting_approval"
    assert sim.gpu(NODE, 0).power_limit == CAPPED
    assert cordoned(sim, NODE)
    marker = sim.node(NODE)["metadata"]["annotations"]["remediator.io/cordoned-by"]
    assert marker == f"run-{detail['id']}"
    assert pod_uids(sim, NODE) == before  # nothing evicted before approval
    started, waiting, held = notifier.sent
    assert held["data"]["event"] == "approval"  # the engine's own notice, once
    assert "step drain (node.drain) needs approval" in held["message"]
    assert started["data"]["stage"] == "started"
    assert started["data"]["gpu_uuid"] == sim.gpu(NODE, 0).uuid
    assert started["data"]["workload"] == "ml-training/llama-finetune-0"
    hot = "GPU 0 on gpu-node-01 is critically hot (92°C)"
    for words in (hot, sim.gpu(NODE, 0).uuid, "cooling"):
        assert words in started["message"]
    assert "Approve the drain" in waiting["message"]
    order = [step(detail, key)["id"] for key in ("notify-start", "power-cap", "cordon")]
    firsts = [next(e["id"] for e in detail["events"] if e["stepId"] == s) for s in order]
    assert firsts == sorted(firsts)  # on-call is told before the cap and the cordon

    assert await approve(h, detail, "drain", "move the training job") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    output = step(detail, "drain")["output"]
    assert "ml-training/llama-finetune-0" in output["gone"]
    after = pod_uids(sim, NODE)
    assert after.get("ml-training/llama-finetune-0") != before["ml-training/llama-finetune-0"]
    assert (
        after["kube-system/nginx-proxy-gpu-node-01"]
        == before["kube-system/nginx-proxy-gpu-node-01"]
    )  # mirror pod left alone
    approval = [e for e in detail["events"] if (e["data"] or {}).get("decision") == "approved"]
    assert approval[0]["reason"] == "move the training job"

    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    undo = await only_run(h, kind="undo")
    assert undo["status"] == "succeeded"
    assert [s["key"] for s in undo["steps"]] == ["undo-cordon", "undo-power-cap"]
    assert sim.gpu(NODE, 0).power_limit == DEFAULT


async def test_a_resolved_alert_before_approval_cancels_the_drain_and_evicts_nothing(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    """robusta#345: a RESOLVED alert must never evict pods."""
    h = await gpu_harness()
    before = pod_uids(sim, NODE)
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-temperature-critical")
    assert step(detail, "drain")["status"] == "waiting_approval"

    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    assert await approve(h, detail, "drain", "too late") == 409
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "cancelled"
    assert statuses(detail)["drain"] == "cancelled"
    assert statuses(detail)["notify-drained"] == "cancelled"
    assert pod_uids(sim, NODE) == before
    assert "run.alert_resolved" in {e["kind"] for e in detail["events"]}
    undo = await only_run(h, kind="undo")
    assert undo["status"] == "succeeded"
    assert sim.gpu(NODE, 0).power_limit == DEFAULT


async def test_temperature_critical_leaves_a_node_someone_else_cordoned_cordoned(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    def cordon(node: dict) -> None:  # type: ignore[type-arg]
        node["spec"]["unschedulable"] = True

    sim.store.mutate("nodes", "", NODE, cordon)
    h = await gpu_harness()
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-temperature-critical")
    assert step(detail, "cordon")["output"]["already_in_place"] is True
    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    undo = await only_run(h, kind="undo")
    assert undo["status"] == "succeeded"
    assert "not cordoned by the run being undone" in str(step(undo, "undo-cordon")["output"])
    assert cordoned(sim, NODE)  # still the other party's cordon
    assert sim.gpu(NODE, 0).power_limit == DEFAULT


async def test_resolution_uncordons_a_node_this_run_cordoned(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    h = await gpu_harness()
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    assert cordoned(sim, NODE)
    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    undo = await only_run(h, kind="undo")
    assert undo["status"] == "succeeded"
    assert not cordoned(sim, NODE), step(undo, "undo-cordon")["output"]
    assert "remediator.io/cordoned-by" not in sim.node(NODE)["metadata"].get("annotations", {})
