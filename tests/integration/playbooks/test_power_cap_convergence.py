"""gpu-temperature-high when its power cap's outcome is unknown: whatever was or was not
recorded, the resolution leaves the GPU at the limit it had before the cap, or leaves a limit
someone else set since alone and says so. Each test replays a failure measured on a drill."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.engine import lifecycle
from remediator.sim import testing
from tests.conftest import am_payload
from tests.integration.conftest import Harness
from tests.integration.kube.conftest import set_faults
from tests.integration.kube.test_temporary_failures import ExecHook
from tests.integration.playbooks.conftest import MakeGpuHarness, body, only_run, post, step

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-node-01"
CAPPED = 490.0  # 70 % of the H100's 700 W default
DEFAULT = 700.0
ZERO = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert
DROP_EVERY_EXEC = {"rules": [{"drop_websocket_rate": 1.0}]}


def gpu0_alert(status: str) -> bytes:
    """GPUTemperatureHigh for GPU 0 of gpu-node-01 alone (its captured resolution)."""
    payload = am_payload("GPUTemperatureHigh-resolved-1alerts")
    if status == "firing":
        payload["alerts"][0] |= {"status": "firing", "endsAt": ZERO}
        payload["status"] = "firing"
    return body(payload)


async def harness_reading_back_through_drops(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> Harness:
    """The shipped rules; every exec stream drops from the first ``-pl`` on, once it ran
    (the cap is set, nothing can read it back), until the test clears the faults; dropped
    reads give up within 0.5 s."""
    kubernetes = {"mode": "url", "url": sim.url, "token": sim.token, "retry_max_seconds": 0.5}
    h = await gpu_harness(kubernetes=kubernetes)
    dropped: list[bool] = []

    async def drop_from_now_on() -> None:
        if not dropped:
            dropped.append(True)
            await set_faults(sim, DROP_EVERY_EXEC)

    services = h.components.services
    services.cluster = ExecHook(services.cluster, drop_from_now_on, flag="-pl", after=True)
    return h


async def cap_as_dead_worker(h: Harness, sim: testing.RunningSim, clock: Any) -> None:
    """A worker claims the power cap, runs its ``-pl`` and dies before recording anything."""
    response = await h.post(gpu0_alert("firing"))
    assert response.status == 200
    await h.engine.handle_episodes()
    await h.engine.start_runs()
    await h.engine.advance_runs()
    [claimed] = await h.store.run(
        "test",
        lambda tx: [
            lifecycle.claim_step(tx, due, owner="dead-worker", lease_until=clock.now)
            for due in tx.lock_due_steps(1)
        ],
    )
    assert claimed.key == "power-cap"
    sim.gpu(NODE, 0).power_limit = CAPPED


async def undo_output(h: Harness) -> dict[str, Any]:
    undo = await only_run(h, kind="undo")
    assert undo["status"] == "succeeded"
    return dict(step(undo, "undo-power-cap")["output"])


async def test_a_power_cap_applied_but_never_read_back_is_undone_to_the_default_on_resolve(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    h = await harness_reading_back_through_drops(gpu_harness, sim)
    await post(h, gpu0_alert("firing"))
    assert sim.gpu(NODE, 0).power_limit == CAPPED  # nvidia-smi -pl ran and returned 0
    clock.advance(10)  # the retry cannot read the limits either
    await h.settle()
    detail = await only_run(h, kind="alert")
    cap = step(detail, "power-cap")
    assert (cap["status"], cap["effect"], cap["attempt"]) == ("pending", "unknown", 2)
    # The retry failed before it could apply; it keeps what the first attempt recorded.
    assert cap["output"]["maybe_applied"] is True
    assert cap["output"]["gpus"][0]["previous_limit"] == DEFAULT

    await set_faults(sim, {"rules": []})
    await post(h, gpu0_alert("resolved"))
    assert (await only_run(h, kind="alert"))["status"] == "cancelled"
    output = await undo_output(h)
    assert sim.gpu(NODE, 0).power_limit == DEFAULT
    assert output["restored"] == {sim.gpu(NODE, 0).uuid: DEFAULT}


async def test_a_power_cap_whose_worker_died_after_setting_it_is_undone_to_the_default(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    h = await gpu_harness()
    await cap_as_dead_worker(h, sim, clock)
    await h.post(gpu0_alert("resolved"))
    clock.advance(6)  # the dead worker's lease expires
    await h.settle()
    cap = step(await only_run(h, kind="alert"), "power-cap")
    assert (cap["status"], cap["effect"]) == ("cancelled", "undone")
    assert cap["output"] == {}  # no previous limit on record
    output = await undo_output(h)
    uuid = sim.gpu(NODE, 0).uuid
    assert sim.gpu(NODE, 0).power_limit == DEFAULT
    assert output["restored"] == {uuid: DEFAULT}
    assert output["restored_to_default"] == [uuid]


async def test_a_cap_found_in_place_on_the_retry_is_undone_to_the_limit_before_the_first_try(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    sim.gpu(NODE, 0).power_limit = 600.0  # set by the operators, below the default
    h = await harness_reading_back_through_drops(gpu_harness, sim)
    await post(h, gpu0_alert("firing"))
    assert sim.gpu(NODE, 0).power_limit == CAPPED
    cap = step(await only_run(h, kind="alert"), "power-cap")
    assert cap["output"]["maybe_applied"] is True
    assert cap["output"]["gpus"][0]["previous_limit"] == 600.0

    await set_faults(sim, {"rules": []})
    clock.advance(10)  # the retry finds the cap in place and writes nothing
    await h.settle()
    cap = step(await only_run(h, kind="alert"), "power-cap")
    assert (cap["status"], cap["attempt"]) == ("succeeded", 2)
    assert cap["output"]["already_in_place"] is True
    [record] = cap["output"]["gpus"]
    assert (record["previous_limit"], record["set_limit"]) == (600.0, CAPPED)

    await post(h, gpu0_alert("resolved"))
    output = await undo_output(h)
    assert sim.gpu(NODE, 0).power_limit == 600.0
    assert output["restored"] == {sim.gpu(NODE, 0).uuid: 600.0}


async def test_a_limit_changed_after_a_cap_with_nothing_on_record_is_left_alone_and_reported(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    h = await gpu_harness()
    await cap_as_dead_worker(h, sim, clock)
    sim.gpu(NODE, 0).power_limit = 550.0  # an operator's own limit, after the cap
    await h.post(gpu0_alert("resolved"))
    clock.advance(6)
    await h.settle()
    output = await undo_output(h)
    uuid = sim.gpu(NODE, 0).uuid
    assert sim.gpu(NODE, 0).power_limit == 550.0
    assert output["left_alone"] == {uuid: "limit changed by someone else to 550 W"}
