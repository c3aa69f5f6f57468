"""gpu.reset, gpu.row_remap_status, node.reboot, node.mark_for_replacement and gpu.ladder
through the real Kubernetes adapter against the simulator."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib
from typing import Any

import pytest

from remediator.actions import ladder, reboot, remap, replacement, reset
from remediator.domain import errors, ladders
from remediator.ports import actions
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, node_events, run_action, run_undo

NODE = "gpu-node-03"


class MemoryLadder:
    """The ladder port over a dict, with the domain's own decisions."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, Any]] = {}

    async def climb(
        self,
        key: str,
        *,
        run_id: int,
        forget_after: dt.timedelta,
        start: ladders.Rung = ladders.Rung.RESET,
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        rung, self.states[key] = ladders.climb(
            self.states.get(key, {}),
            run_id=run_id,
            now=dt.datetime.now(dt.UTC),
            forget_after=forget_after,
            start=start,
        )
        return rung, self.states[key]

    async def escalate(
        self, key: str, *, run_id: int, to: ladders.Rung, reason: str
    ) -> tuple[ladders.Rung, dict[str, Any]]:
        rung, self.states[key] = ladders.escalate(
            self.states.get(key, {}),
            run_id=run_id,
            to=to,
            now=dt.datetime.now(dt.UTC),
            reason=reason,
        )
        return rung, self.states[key]

    async def decline(
        self, key: str, *, run_id: int, reason: str
    ) -> tuple[ladders.Rung | None, dict[str, Any]]:
        rung, self.states[key] = ladders.decline(
            self.states.get(key, {}), run_id=run_id, now=dt.datetime.now(dt.UTC), reason=reason
        )
        return rung, self.states[key]

    async def state(self, key: str) -> dict[str, Any]:
        return self.states.get(key, {})


def with_services(ctx: actions.ActionContext, **services: Any) -> actions.ActionContext:
    return dataclasses.replace(ctx, services={**ctx.services, **services})


def drain(sim: testing.RunningSim, node: str) -> None:
    """What node.drain leaves: no pod holding a GPU on the node."""
    for pod in sim.pods(node=node):
        limits = [c.get("resources", {}).get("limits", {}) for c in pod["spec"]["containers"]]
        if any("nvidia.com/gpu" in lim for lim in limits):
            sim.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])


async def test_reset_refuses_while_gpu_pods_run_on_the_node(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    gpu = sim.gpu(NODE, 3)
    with pytest.raises(errors.ActionFailed, match="research/jupyter-alice") as info:
        await run_action(reset.ResetAction(), make_ctx(node=NODE, gpu=gpu.uuid), {})
    assert "drain the node first" in str(info.value)
    assert not any("-r" in e.argv for e in sim.cluster.exec_log)


async def test_reset_refuses_while_a_process_uses_the_gpu(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    drain(sim, NODE)
    gpu = sim.gpu(NODE, 3)
    gpu.processes = [{"pid": 4242, "name": "python3", "used_mib": 1000}]
    with pytest.raises(errors.ActionFailed, match=r"in use by python3 \(pid 4242\)"):
        await run_action(reset.ResetAction(), make_ctx(node=NODE, gpu=gpu.uuid), {})
    assert not any("-r" in e.argv for e in sim.cluster.exec_log)


async def test_reset_clears_the_gpu_and_verifies_it_answers_healthy(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    drain(sim, NODE)
    gpu = sim.gpu(NODE, 3)
    gpu.ecc_uncorrected_volatile, gpu.remap_pending = 2, True
    output = await run_action(reset.ResetAction(), make_ctx(node=NODE, gpu=gpu.uuid), {})
    assert output["reset"] is True
    assert output["verified"]["ecc_uncorrected_volatile"] == 0
    assert output["verified"]["remapped_rows"][0]["verdict"] == "ok"
    assert (gpu.ecc_uncorrected_volatile, gpu.remap_pending) == (0, False)
    assert ["nvidia-smi", "-r", "-i", gpu.uuid] in [e.argv for e in sim.cluster.exec_log]
    assert "RemediatorGpuReset" in {e["reason"] for e in node_events(sim, NODE)}


async def test_reset_refuses_a_gpu_id_that_is_not_one(make_ctx: MakeContext) -> None:
    with pytest.raises(errors.ActionFailed, match="not a GPU index, UUID or PCI bus id"):
        await run_action(reset.ResetAction(), make_ctx(node=NODE, gpu="0; reboot"), {})


async def test_a_failed_reset_fails_the_step_off_the_ladder_and_climbs_it_on_the_ladder(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    drain(sim, NODE)
    gpu = sim.gpu(NODE, 3)
    gpu.lost = True  # Xid 79: the reset cannot reach it
    with pytest.raises(errors.ActionFailed, match=r"fallen off the bus \(exit 15\)"):
        await run_action(reset.ResetAction(), make_ctx(node=NODE, gpu=gpu.uuid), {})

    store = MemoryLadder()
    ctx = with_services(make_ctx(node=NODE, gpu=gpu.uuid), ladder=store)
    decided = await run_action(ladder.LadderAction(), ctx, {})
    assert decided["rung"] == "reset"
    output = await run_action(reset.ResetAction(), ctx, {"rung": "reset"})
    assert output["reset"] is False
    assert output["escalated_to"] == "reboot"
    assert "fallen off the bus" in output["error"]
    assert await ladder.run_rung(ctx) is ladders.Rung.REBOOT


async def test_ladder_steps_on_another_rung_change_nothing(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    store = MemoryLadder()
    ctx = with_services(make_ctx(node=NODE, gpu=sim.gpu(NODE, 3).uuid), ladder=store)
    await run_action(ladder.LadderAction(), ctx, {})
    executed = len(sim.cluster.exec_log)
    out = await run_action(reboot.RebootAction(), ctx, {"rung": "reboot"})
    assert out["skipped"] is True
    assert out["ladder_rung"] == "reset"
    out = await run_action(replacement.MarkForReplacementAction(), ctx, {"rung": "replace"})
    assert out["skipped"] is True
    assert len(sim.cluster.exec_log) == executed
    assert sim.cluster.reboots == []


async def test_a_rung_step_without_a_ladder_decision_fails(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = with_services(make_ctx(node=NODE, gpu="3"), ladder=MemoryLadder())
    with pytest.raises(errors.ActionFailed, match=r"put a gpu\.ladder step before"):
        await run_action(reset.ResetAction(), ctx, {"rung": "reset"})


async def test_row_remap_status_reads_pending_and_failure_and_climbs_the_ladder(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    node = "gpu-node-04"
    gpu = sim.gpu(node, 1)
    store = MemoryLadder()
    ctx = with_services(make_ctx(node=node, gpu=gpu.uuid), ladder=store)
    action = remap.RowRemapStatusAction()
    clean = await run_action(action, ctx, {})
    assert clean["verdict"] == "ok"
    assert clean["gpus"] == [
        {
            "pci_bus_id": gpu.pci_bus_id,
            "uuid": gpu.uuid,
            "correctable": 0,
            "uncorrectable": 0,
            "pending": False,
            "failure": False,
            "verdict": "ok",
        }
    ]
    gpu.remap_pending, gpu.remapped_uncorrectable = True, 1
    pending = await run_action(action, ctx, {"escalate": True})
    assert pending["verdict"] == "reset"
    assert pending["ladder_rung"] == "reset"
    gpu.remap_failure = True
    with pytest.raises(errors.ActionFailed, match="row remap failure") as info:
        await run_action(action, ctx, {"escalate": True, "fail_on": ["failure"]})
    assert info.value.output["ladder_rung"] == "replace"
    assert await ladder.run_rung(ctx) is ladders.Rung.REPLACE


def test_row_remap_parse_reads_the_real_h200_capture() -> None:
    fixture = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi" / "h200"
    text = (fixture / "nvidia-smi-extra.txt").read_text()
    section = text.split("## remapped rows csv\n", 1)[1].split("\n## ", 1)[0]
    [state] = remap.parse(section)
    assert state.uuid == "GPU-1f353fa8-c14f-a7d3-7f44-ebb4cdc60f49"
    assert state.pci_bus_id == "00000000:00:06.0"
    assert (state.correctable, state.uncorrectable, state.pending, state.failure) == (
        0,
        0,
        False,
        False,
    )


def hook(sim: testing.RunningSim, tmp_path: pathlib.Path) -> reboot.RebootConfig:
    token = tmp_path / "hook-token"
    token.write_text(sim.token + "\n")
    return reboot.RebootConfig(
        method="hook", hook_url=f"{sim.url}/sim/v1/reboots", hook_token_file=token
    )


async def test_reboot_through_the_hook_waits_for_not_ready_then_ready_and_the_driver_pod(
    sim: testing.RunningSim, make_ctx: MakeContext, tmp_path: pathlib.Path
) -> None:
    sim.cluster.settings.reboot_seconds = 30  # 0.3 s
    sim.store.mutate("nodes", "", NODE, lambda n: n["spec"].update(unschedulable=True))
    gpu = sim.gpu(NODE, 3)
    gpu.lost = True
    before = sim.node(NODE)["status"]["nodeInfo"]["bootID"]
    ctx = with_services(make_ctx(node=NODE), reboot=hook(sim, tmp_path))
    output = await run_action(reboot.RebootAction(), ctx, {"poll_seconds": 0.05})
    assert sim.cluster.reboots == [NODE]
    assert output["boot_id_before"] == before
    assert output["boot_id"] != before
    assert output["driver_pod"].startswith("gpu-operator/")
    assert gpu.lost is False  # the reboot brought the GPU back
    assert "RemediatorReboot" in {e["reason"] for e in node_events(sim, NODE)}
    again = await run_action(reboot.RebootAction(), make_ctx(node=NODE, applied_output=output), {})
    assert again["already_in_place"] is True  # a retry never reboots twice
    assert sim.cluster.reboots == [NODE]


async def test_reboot_by_pod_runs_a_privileged_pod_on_the_node_and_deletes_it_after(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.cluster.settings.reboot_seconds = 30
    sim.store.mutate("nodes", "", NODE, lambda n: n["spec"].update(unschedulable=True))
    ctx = with_services(make_ctx(node=NODE), reboot=reboot.RebootConfig(method="pod"))
    output = await run_action(reboot.RebootAction(), ctx, {"poll_seconds": 0.05})
    assert sim.cluster.reboots == [NODE]
    namespace, name = output["pod"].split("/")
    assert namespace == "gpu-operator"
    assert output["boot_id"] != output["boot_id_before"]
    await sim.wait_for(lambda: sim.pod(namespace, name) is None)  # cleaned up
    manifest = reboot.reboot_pod(ctx, reboot.RebootConfig(method="pod"), NODE, namespace)
    container = manifest["spec"]["containers"][0]
    assert manifest["spec"]["hostPID"] is True
    assert manifest["spec"]["nodeName"] == NODE
    assert container["securityContext"] == {"privileged": True}
    assert [*container["command"], *container["args"]][-2:] == ["systemctl", "reboot"]


async def test_reboot_refuses_an_uncordoned_node_and_by_default_asks_on_call(
    sim: testing.RunningSim, make_ctx: MakeContext, tmp_path: pathlib.Path
) -> None:
    ctx = with_services(make_ctx(node=NODE), reboot=hook(sim, tmp_path))
    with pytest.raises(errors.ActionFailed, match="is not cordoned"):
        await run_action(reboot.RebootAction(), ctx, {})
    sim.store.mutate("nodes", "", NODE, lambda n: n["spec"].update(unschedulable=True))
    manual = make_ctx(node=NODE)
    asked = await run_action(reboot.RebootAction(), manual, {})
    assert asked["rebooted"] is False
    [sent] = manual.notifier.sent  # type: ignore[attr-defined]
    assert sent["data"]["action_needed"] == "reboot-node"
    assert sim.cluster.reboots == []


async def test_reboot_fails_when_the_node_never_goes_down(
    sim: testing.RunningSim, make_ctx: MakeContext, tmp_path: pathlib.Path
) -> None:
    sim.store.mutate("nodes", "", NODE, lambda n: n["spec"].update(unschedulable=True))
    refusing = hook(sim, tmp_path).model_copy(update={"hook_url": f"{sim.url}/version"})
    with pytest.raises(errors.ActionFailed, match="reboot hook refused gpu-node-03: 405"):
        await run_action(
            reboot.RebootAction(), with_services(make_ctx(node=NODE), reboot=refusing), {}
        )
    # A hook that reboots some other machine: this node never goes down.
    wrong = f"{sim.url}/sim/v1/nodes/gpu-node-01/reboot"
    config = hook(sim, tmp_path).model_copy(update={"hook_url": wrong})
    ctx = with_services(make_ctx(node=NODE), reboot=config)
    with pytest.raises(errors.ActionFailed, match="did not go down within") as info:
        await run_action(reboot.RebootAction(), ctx, {"timeout_seconds": 0.3, "poll_seconds": 0.05})
    assert info.value.output["maybe_applied"] is True


async def test_mark_for_replacement_labels_annotates_and_notifies_with_the_evidence(
    sim: testing.RunningSim, make_ctx: MakeContext, tmp_path: pathlib.Path
) -> None:
    node = "gpu-node-02"
    gpu = sim.gpu(node, 5)
    gpu.ecc_uncorrected_volatile, gpu.ecc_uncorrected_aggregate = 1, 4
    gpu.remap_failure, gpu.remapped_uncorrectable = True, 8
    report = tmp_path / "artifacts" / node / "11-4-nvidia-bug-report.log.gz"
    report.parent.mkdir(parents=True)
    report.write_bytes(b"report")
    ctx = with_services(make_ctx(node=node, gpu=gpu.uuid), ladder=MemoryLadder())
    action = replacement.MarkForReplacementAction()
    output = await run_action(action, ctx, {"reason": "Xid 79 after a reboot"})
    labels = sim.node(node)["metadata"]["labels"]
    assert labels[replacement.LABEL] == "gpu"
    evidence = json.loads(sim.node(node)["metadata"]["annotations"][replacement.ANNOTATION])
    assert evidence == output["evidence"]
    assert evidence["bug_report"] == f"/api/v1/artifacts/{node}/11-4-nvidia-bug-report.log.gz"
    assert evidence["ecc"] == [
        {
            "uuid": gpu.uuid,
            "uncorrectable_volatile": 1,
            "uncorrectable_aggregate": 4,
            "correctable_volatile": 0,
        }
    ]
    assert evidence["remapped_rows"][0]["failure"] is True
    [sent] = ctx.notifier.sent  # type: ignore[attr-defined]
    assert "needs replacing (RMA)" in sent["message"]
    assert sent["data"]["evidence"]["bug_report"] == evidence["bug_report"]
    again = await run_action(action, ctx, {})
    assert again["already_in_place"] is True

    await run_undo(action, make_ctx(node=node, applied_output=output), {})
    assert replacement.LABEL not in sim.node(node)["metadata"]["labels"]
    assert replacement.ANNOTATION not in sim.node(node)["metadata"]["annotations"]


async def test_mark_for_replacement_of_a_lost_gpu_records_why_it_could_not_read_it(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.gpu(NODE, 3).lost = True
    ctx = with_services(make_ctx(node=NODE, gpu=sim.gpu(NODE, 3).uuid), ladder=MemoryLadder())
    output = await run_action(replacement.MarkForReplacementAction(), ctx, {})
    assert output["evidence"]["bug_report"] is None
    bus = sim.gpu(NODE, 3).pci_bus_id[4:]  # as nvidia-smi prints it for a lost GPU
    assert output["evidence"]["lost_gpus"] == [bus]
    assert "does not answer nvidia-smi" in output["evidence"]["unreadable"]
