"""Failures that may pass (an API server restarting, 5xx, dropped exec streams) are ridden out
within the transport's retry window, or end as temporary step failures; a change that may have
reached the cluster before the failure is reported as ``maybe_applied``."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

import pytest

from remediator.actions import drain, gpu, kube, pods
from remediator.adapters import kubernetes
from remediator.domain import errors
from remediator.ports import cluster as port
from remediator.sim import mutations, testing
from tests.integration.kube.conftest import (
    Connect,
    MakeContext,
    run_action,
    run_undo,
    set_faults,
    start_listening,
    stop_listening,
)

LLAMA = {"namespace": "ml-training", "pod": "llama-finetune-0"}
LLAMA_BUDGET = ("ml-training", "llama-finetune")
FAST_DRAIN: dict[str, Any] = {
    "eviction_retry_interval_seconds": 0.1,
    "poll_interval_seconds": 0.05,
    "delete_emptydir_data": True,
    "timeout_seconds": 20,
}
DROP_EVERY_EXEC = {"rules": [{"drop_websocket_rate": 1.0}]}
QUERY = ["nvidia-smi", f"--query-gpu={gpu.QUERY}", "--format=csv,noheader,nounits"]
EVICTIONS_500 = {
    "path_prefix": "/api/v1/namespaces/ml-training/",
    "methods": ["POST"],
    "rate_500": 1.0,
}


class ExecHook:
    """The real cluster, with ``hook`` awaited before (or after) each exec whose argv has
    ``flag``: the fault arrives at a chosen moment of an action."""

    def __init__(
        self,
        cluster: kubernetes.KubeCluster,
        hook: Callable[[], Any],
        *,
        flag: str | None = None,
        after: bool = False,
    ) -> None:
        self._cluster = cluster
        self._hook = hook
        self._flag = flag
        self._after = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    async def exec(self, **kwargs: Any) -> port.ExecResult:
        hit = self._flag is None or self._flag in kwargs["argv"]
        if hit and not self._after:
            await self._hook()
        result = await self._cluster.exec(**kwargs)
        if hit and self._after:
            await self._hook()
        return result


# ---- an API server that goes away -------------------------------------------------------


async def test_an_api_outage_shorter_than_the_retry_window_does_not_fail_a_cordon(
    sim: testing.RunningSim, make_ctx: MakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "remediator.adapters.kubernetes")
    await stop_listening(sim)
    task = asyncio.create_task(run_action(kube.CordonAction(), make_ctx(), {}))
    await asyncio.sleep(5.0)  # long enough for a fixed count of quick attempts to run out
    assert not task.done()
    await start_listening(sim)
    output = await asyncio.wait_for(task, 10)
    assert output["cordoned"] is True
    assert sim.node("gpu-node-01")["spec"]["unschedulable"] is True
    assert any("ClientConnectorError" in r.getMessage() for r in caplog.records)


async def test_an_api_outage_during_an_exec_does_not_fail_a_power_cap(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster, make_ctx: MakeContext
) -> None:
    outages: list[asyncio.Task[None]] = []

    async def outage() -> None:
        if not outages:  # the first exec finds the server gone; it is back a second later
            await stop_listening(sim)
            outages.append(asyncio.create_task(back_in(1.0)))

    async def back_in(seconds: float) -> None:
        await asyncio.sleep(seconds)
        await start_listening(sim)

    ctx = make_ctx(gpu="0", kube=ExecHook(cluster, outage))
    output = await asyncio.wait_for(run_action(gpu.PowerCapAction(), ctx, {"watts": 400}), 10)
    assert outages[0].done()
    assert output["gpus"][0]["verified_limit"] == 400.0
    assert sim.gpu("gpu-node-01", 0).power_limit == 400.0


async def test_connection_refused_after_the_retry_window_is_a_temporary_failure(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)
    await stop_listening(sim)
    with pytest.raises(errors.ActionFailed, match="reading node gpu-node-01") as info:
        await run_action(kube.CordonAction(), make_ctx(kube=short), {})
    assert info.value.temporary is True
    assert isinstance(info.value.__cause__, port.Unavailable)
    assert "maybe_applied" not in info.value.output  # it failed before writing anything


async def test_an_exec_that_cannot_connect_is_a_temporary_failure_not_a_hang(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=5.0)

    async def outage() -> None:
        await stop_listening(sim)

    params = {"watts": 400, "exec_timeout_seconds": 0.5}  # shorter than the retry window
    ctx = make_ctx(gpu="0", kube=ExecHook(short, outage))
    with pytest.raises(errors.ActionFailed, match=r"no connection within 0\.5s") as info:
        await run_action(gpu.PowerCapAction(), ctx, params)
    assert info.value.temporary is True
    assert not isinstance(info.value.__cause__, port.ExecTimedOut)


# ---- 5xx and failed websocket handshakes --------------------------------------------------


async def test_an_eviction_answered_with_500_is_a_temporary_failure(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)
    await set_faults(sim, {"rules": [EVICTIONS_500]})
    with pytest.raises(errors.ActionFailed, match="injected fault") as info:
        await run_action(pods.EvictAction(), make_ctx(kube=short), LLAMA)
    assert info.value.temporary is True
    assert info.value.output["maybe_applied"] is True  # the POST may have landed
    assert sim.pod("ml-training", "llama-finetune-0") is not None


async def test_a_drain_whose_evictions_answer_500_fails_temporarily_and_stays_cordoned(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)
    await set_faults(sim, {"rules": [EVICTIONS_500]})
    with pytest.raises(errors.ActionFailed, match="drain of gpu-node-04 failed") as info:
        await run_action(drain.DrainAction(), make_ctx(node="gpu-node-04", kube=short), FAST_DRAIN)
    assert info.value.temporary is True
    assert info.value.output["maybe_applied"] is True
    assert info.value.output["errors"]
    assert sim.node("gpu-node-04")["spec"]["unschedulable"] is True


async def test_a_drain_rides_out_occasional_eviction_500s(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    await set_faults(sim, {"rules": [{**EVICTIONS_500, "rate_500": 0.5}], "seed": 7})
    output = await run_action(drain.DrainAction(), make_ctx(node="gpu-node-04"), FAST_DRAIN)
    assert output["remaining"] == []
    assert output["errors"] == {}


async def test_an_eviction_that_several_budgets_refuse_is_temporary_and_not_retried_at_once(
    sim: testing.RunningSim, make_ctx: MakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    pdb = copy.deepcopy(sim.store.must_get("poddisruptionbudgets.policy", *LLAMA_BUDGET))
    pdb["metadata"] = {"name": "llama-finetune-too", "namespace": "ml-training"}
    sim.store.create("poddisruptionbudgets.policy", pdb)
    caplog.set_level(logging.WARNING, "remediator.adapters.kubernetes")
    with pytest.raises(errors.ActionFailed, match="more than one PodDisruptionBudget") as info:
        await run_action(pods.EvictAction(), make_ctx(), LLAMA)
    assert info.value.temporary is True
    assert info.value.retry_after == 5.0
    assert not any("evict" in r.getMessage() for r in caplog.records)  # an answer, not a fault


async def test_an_exec_handshake_answered_with_503_is_retried_then_temporary(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)
    exec_503 = {"path_prefix": "/api/v1/namespaces/gpu-operator/pods/", "rate_503": 1.0}
    await set_faults(sim, {"rules": [exec_503]})
    with pytest.raises(errors.ActionFailed, match=r"503|unable to handle") as info:
        await run_action(gpu.PowerCapAction(), make_ctx(gpu="0", kube=short), {"watts": 400})
    assert info.value.temporary is True
    assert "maybe_applied" not in info.value.output  # the first read failed: nothing was set
    assert sim.gpu("gpu-node-01", 0).power_limit == 700.0


# ---- dropped exec streams -----------------------------------------------------------------


def driver_exec(sim: testing.RunningSim, argv: list[str]) -> dict[str, Any]:
    pod = sim.driver_pod("gpu-node-01")["metadata"]["name"]
    return {
        "namespace": "gpu-operator",
        "pod": pod,
        "container": "nvidia-driver-ctr",
        "argv": argv,
        "timeout": 10.0,
    }


def repeated_effects(sim: testing.RunningSim) -> list[Any]:
    entries = [e.json() for e in sim.cluster.mutations.entries]
    return mutations.repeated(entries)


async def test_a_read_whose_exec_stream_drops_is_run_again(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "remediator.adapters.kubernetes")
    drops = {"drop_websocket_rate": 0.4, "drop_websocket_after_rate": 0.4}
    await set_faults(sim, {"rules": [drops], "seed": 2})
    for _ in range(3):
        result = await cluster.exec(**driver_exec(sim, QUERY), idempotent=True)
        assert result.exit_code == 0
        assert b"GPU-" in result.stdout
    assert {r.dropped for r in sim.cluster.exec_log} >= {"before", "after"}
    assert any("ExecInterrupted" in r.getMessage() for r in caplog.records)


async def test_a_command_whose_exec_stream_drops_after_it_ran_is_not_run_again(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    await set_faults(sim, {"rules": [{"drop_websocket_after_rate": 1.0}]})
    uuid = sim.gpu("gpu-node-01", 0).uuid
    with pytest.raises(port.ExecInterrupted) as info:
        await cluster.exec(**driver_exec(sim, ["nvidia-smi", "-i", uuid, "-pl", "400"]))
    assert info.value.temporary is True
    assert len(sim.cluster.exec_log) == 1
    assert sim.gpu("gpu-node-01", 0).power_limit == 400.0


async def test_a_power_cap_whose_set_dropped_after_running_is_found_in_place_on_the_retry(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster, make_ctx: MakeContext
) -> None:
    async def drop_the_exit_status() -> None:
        await set_faults(sim, {"rules": [{"drop_websocket_after_rate": 1.0}]})

    ctx = make_ctx(gpu="0", kube=ExecHook(cluster, drop_the_exit_status, flag="-pl"))
    with pytest.raises(errors.ActionFailed, match="exec stream ended") as info:
        await run_action(gpu.PowerCapAction(), ctx, {"watts": 400})
    assert info.value.temporary is True
    assert info.value.output["maybe_applied"] is True
    assert sim.gpu("gpu-node-01", 0).power_limit == 400.0

    await set_faults(sim, {"rules": []})
    retried = await run_action(gpu.PowerCapAction(), make_ctx(gpu="0"), {"watts": 400})
    assert retried["already_in_place"] is True
    assert repeated_effects(sim) == []  # the limit was written once


async def test_a_power_cap_applied_before_its_read_back_dropped_is_temporary_and_maybe_applied(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)
    target = sim.gpu("gpu-node-01", 0)
    target.power_limit = 650.0

    async def drop_from_now_on() -> None:
        await set_faults(sim, DROP_EVERY_EXEC)

    ctx = make_ctx(gpu="0", kube=ExecHook(short, drop_from_now_on, flag="-pl", after=True))
    with pytest.raises(errors.ActionFailed, match="exec stream ended") as info:
        await run_action(gpu.PowerCapAction(), ctx, {"watts": 400})
    assert target.power_limit == 400.0  # nvidia-smi -pl ran and returned 0
    failed = info.value
    assert failed.temporary is True
    assert failed.output["maybe_applied"] is True
    [record] = failed.output["gpus"]  # type: ignore[misc]
    assert record["uuid"] == target.uuid
    assert record["previous_limit"] == 650.0
    assert record["set_limit"] == 400.0

    await set_faults(sim, {"rules": []})
    undone = await run_undo(
        gpu.PowerCapAction(), make_ctx(gpu="0", applied_output=failed.output), {"watts": 400}
    )
    assert target.power_limit == 650.0
    assert undone["restored"] == {target.uuid: 650.0}


async def test_a_power_cap_whose_set_never_ran_is_maybe_applied_and_its_undo_changes_nothing(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)

    async def drop_from_now_on() -> None:
        await set_faults(sim, DROP_EVERY_EXEC)

    ctx = make_ctx(gpu="0", kube=ExecHook(short, drop_from_now_on, flag="-pl"))
    with pytest.raises(errors.ActionFailed) as info:
        await run_action(gpu.PowerCapAction(), ctx, {"watts": 400})
    assert info.value.temporary is True
    assert info.value.output["maybe_applied"] is True  # the stream dropped: nobody can tell
    assert sim.gpu("gpu-node-01", 0).power_limit == 700.0

    await set_faults(sim, {"rules": []})
    undone = await run_undo(
        gpu.PowerCapAction(), make_ctx(gpu="0", applied_output=info.value.output), {"watts": 400}
    )
    assert undone["already_in_place"] is True
    assert sim.gpu("gpu-node-01", 0).power_limit == 700.0


async def test_a_retry_that_completes_a_partial_power_cap_keeps_the_first_previous_limits(
    sim: testing.RunningSim, connect: Connect, make_ctx: MakeContext
) -> None:
    short = await connect(retry_max_seconds=0.5)
    sim.gpu("gpu-node-01", 0).power_limit = 600.0
    params = {"watts": 400, "gpus": ["0", "1"]}
    dropped: list[bool] = []

    async def drop_after_the_first_set() -> None:
        if not dropped:
            dropped.append(True)
            await set_faults(sim, DROP_EVERY_EXEC)

    ctx = make_ctx(kube=ExecHook(short, drop_after_the_first_set, flag="-pl", after=True))
    with pytest.raises(errors.ActionFailed) as info:
        await run_action(gpu.PowerCapAction(), ctx, params)
    assert info.value.output["maybe_applied"] is True
    assert [sim.gpu("gpu-node-01", i).power_limit for i in (0, 1)] == [400.0, 700.0]

    await set_faults(sim, {"rules": []})
    # The engine hands the retry the failed attempt's output.
    retry = make_ctx(applied_output=info.value.output)
    retried = await run_action(gpu.PowerCapAction(), retry, params)
    assert [r["previous_limit"] for r in retried["gpus"]] == [600.0, 700.0]
    assert [sim.gpu("gpu-node-01", i).power_limit for i in (0, 1)] == [400.0, 400.0]

    await run_undo(gpu.PowerCapAction(), make_ctx(applied_output=retried), params)
    assert [sim.gpu("gpu-node-01", i).power_limit for i in (0, 1)] == [600.0, 700.0]
