"""Driver upgrades: the gpu-driver-upgrade runbook rolls a new driver over nodes one at a
time through the simulated GPU Operator, stops at the first failure, and alert-driven
disruptive steps wait while a node's driver is being upgraded."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    MakeGpuHarness,
    cordoned,
    fixture,
    labels,
    only_run,
    post,
    statuses,
    step,
)

pytestmark = pytest.mark.timeout(120)

STATE = "nvidia.com/gpu-driver-upgrade-state"


def set_label(sim: testing.RunningSim, node: str, key: str, value: str | None) -> None:
    def change(obj: dict[str, Any]) -> None:
        node_labels = obj["metadata"].setdefault("labels", {})
        if value is None:
            node_labels.pop(key, None)
        else:
            node_labels[key] = value

    sim.cluster.store.mutate("nodes", "", node, change)


async def test_an_xid_cordon_waits_while_the_gpu_operator_upgrades_the_driver(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    node = "gpu-node-03"
    set_label(sim, node, STATE, "pod-restart-required")
    h = await gpu_harness()
    await post(h, fixture("GPUXidError79-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-xid-error")
    cordon = step(detail, "cordon")
    assert cordon["status"] == "pending", statuses(detail)
    assert cordon["output"]["held"] == (
        f"node {node}: the GPU Operator is upgrading its driver ({STATE}=pod-restart-required)"
    )
    assert not cordoned(sim, node)

    clock.advance(20)  # still upgrading at the recheck: still held
    await h.settle()
    assert step(await only_run(h, playbook="gpu-xid-error"), "cordon")["status"] == "pending"

    set_label(sim, node, STATE, "upgrade-done")
    clock.advance(20)
    await h.settle()
    detail = await only_run(h, playbook="gpu-xid-error")
    assert step(detail, "cordon")["status"] == "succeeded", statuses(detail)
    assert cordoned(sim, node)
    assert labels(sim, node)[STATE] == "upgrade-done"
