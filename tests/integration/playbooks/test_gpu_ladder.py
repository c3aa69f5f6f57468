"""The ladder across episodes: Xid 79 on the same GPU, three times, climbs reset → reboot →
mark-for-replacement, each episode through the webhook, guarded and audited."""

from __future__ import annotations

import json
from typing import Any

import pytest

from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    approve,
    built,
    cordoned,
    labels,
    node_events,
    post,
    statuses,
    step,
)

pytestmark = pytest.mark.timeout(120)

NODE = "gpu-node-03"
FINGERPRINT = "868282cd8cb6d526"
SUMMARY = "GPU 3 on gpu-node-03 has fallen off the bus (Xid 79)"


def episode(status: str, starts_at: str) -> bytes:
    return built(
        "GPUXidError79-firing-1alerts",
        alertname="GPUXidError79",
        summary=SUMMARY,
        fingerprint=FINGERPRINT,
        status=status,
        starts_at=starts_at,
    )


async def audit_events(h: Any, run_id: int) -> list[dict[str, Any]]:
    response = await h.client.get(
        "/api/v1/audit/events", params={"run": str(run_id), "limit": "500"}
    )
    assert response.status == 200, await response.text()
    return list((await response.json())["items"])


async def test_xid79_on_the_same_gpu_climbs_reset_then_reboot_then_replacement(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier, clock: Any
) -> None:
    gpu = sim.gpu(NODE, 3)
    h = await gpu_harness()
    done: list[dict[str, Any]] = []
    for number, starts_at in enumerate(
        ["2026-11-30T00:02:27.47Z", "2026-12-02T00:02:27.47Z", "2026-12-04T00:02:27.47Z"]
    ):
        gpu.ecc_uncorrected_volatile = 1  # what the fault leaves in the driver's counters
        await post(h, episode("firing", starts_at))
        runs = await h.runs(playbook="gpu-xid-error")
        assert len(runs) == number + 1
        detail = await h.run_detail(runs[0]["id"])
        assert detail["status"] == "waiting_approval", statuses(detail)
        assert await approve(h, detail, "drain", f"episode {number + 1}") == 200
        detail = await h.run_detail(detail["id"])
        assert detail["status"] == "succeeded", statuses(detail)
        done.append(detail)
        await post(h, episode("resolved", starts_at))
        clock.advance(2 * 86400)  # the fault comes back two days later

    first, second, third = done
    assert [step(d, "ladder")["output"]["rung"] for d in done] == ["reset", "reboot", "replace"]

    # Episode 1: the GPU is reset (it still answers), nothing else.
    assert step(first, "reset")["output"]["reset"] is True
    assert step(first, "reboot")["output"]["skipped"] is True
    assert step(first, "replace")["output"]["skipped"] is True
    # Episode 2: the fault came back after the reset: the node is rebooted.
    assert step(second, "reset")["output"]["skipped"] is True
    assert (
        step(second, "reboot")["output"]["boot_id"]
        != step(second, "reboot")["output"]["boot_id_before"]
    )
    assert step(second, "replace")["output"]["skipped"] is True
    assert sim.cluster.reboots == [NODE]
    # Episode 3: and after the reboot: the node is marked for replacement, with the evidence.
    assert step(third, "reset")["output"]["skipped"] is True
    assert step(third, "reboot")["output"]["skipped"] is True
    evidence = step(third, "replace")["output"]["evidence"]
    assert evidence["bug_report"].startswith(f"/api/v1/artifacts/{NODE}/")
    assert evidence["bug_report"].endswith("-nvidia-bug-report.log.gz")
    assert [e["rung"] for e in evidence["ladder"]] == ["reset", "reboot", "replace"]
    assert evidence["ecc"][0]["uncorrectable_volatile"] == 1
    assert evidence["remapped_rows"][0]["failure"] is False
    assert labels(sim, NODE)["remediator.io/replace"] == "gpu"
    annotation = sim.node(NODE)["metadata"]["annotations"]["remediator.io/replace-evidence"]
    assert json.loads(annotation)["run_id"] == third["id"]
    replacement = [m for m in notifier.sent if m["data"].get("action_needed") == "replace-gpu"]
    assert len(replacement) == 1
    assert replacement[0]["data"]["evidence"]["bug_report"] == evidence["bug_report"]
    assert cordoned(sim, NODE)  # never returned to service automatically
    assert sim.cluster.reboots == [NODE]  # one reboot in three episodes
    reasons = node_events(sim, NODE)
    for reason in ("RemediatorGpuReset", "RemediatorReboot", "RemediatorMarkForReplacement"):
        assert reason in reasons

    # Each episode is its own run, approved by a person and audited with its ladder decision.
    # Each episode is its own run: its drain approved by a person, its ladder decision and
    # every rung step (acting or standing aside) in the audit trail.
    for number, detail in enumerate(done, start=1):
        events = await audit_events(h, detail["id"])
        climbed = [e for e in events if e["kind"] == "ladder.climbed"]
        assert [e["data"]["rung"] for e in climbed] == [["reset", "reboot", "replace"][number - 1]]
        approved = [
            e
            for e in events
            if e["kind"] == "step.transition" and e["data"].get("decision") == "approved"
        ]
        assert [e["data"]["key"] for e in approved] == ["drain"]
        assert approved[0]["reason"] == f"episode {number}"
        finished = {
            e["data"]["key"]
            for e in events
            if e["kind"] == "step.transition" and e["toStatus"] == "succeeded"
        }
        assert {"ladder", "reset", "reboot", "replace"} <= finished
