"""Storm: 50 nodes report Xid 79 within a minute. No more nodes than the budget are disrupted,
the breaker opens and says so, the rest wait; after a reset they proceed within the budget as
nodes return to service. Real playbooks, the real client, the simulated cluster."""

from __future__ import annotations

import json

import pytest

from remediator.engine import lifecycle
from remediator.sim import fleet as fleet_mod
from remediator.sim import testing
from tests.conftest import ROOT, am_payload
from tests.support.notify import FakeNotifier

NODES = [f"gpu-storm-{i:02d}" for i in range(50)]


def storm_fleet() -> fleet_mod.Fleet:
    gpu_labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100"}
    return fleet_mod.Fleet.model_validate(
        {
            "settings": {"time_scale": 0.01, "pod_startup_seconds": 0.1},
            "namespaces": ["gpu-operator"],
            "nodes": [
                {"name": name, "labels": gpu_labels, "gpus": {"model": "H100", "count": 2}}
                for name in NODES
            ],
            "workloads": [
                {
                    "kind": "DaemonSet",
                    "name": "nvidia-driver-daemonset",
                    "namespace": "gpu-operator",
                    "labels": {
                        "app": "nvidia-driver-daemonset",
                        "app.kubernetes.io/component": "nvidia-driver",
                    },
                    "node_selector": {"nvidia.com/gpu.present": "true"},
                    "containers": [{"name": "nvidia-driver-ctr"}],
                }
            ],
        }
    )


def xid_alert(node: str) -> bytes:
    body = am_payload("GPUXidError79-firing-1alerts")
    alert = body["alerts"][0]
    for key in ("node", "Hostname"):
        alert["labels"][key] = node
    alert["labels"]["instance"] = f"{node}:9400"
    alert["labels"]["UUID"] = fleet_mod.gpu_uuid(node, 0)
    alert["labels"]["gpu"] = "0"
    alert["fingerprint"] = f"{abs(hash(node)) % 16**16:016x}"
    return json.dumps(body).encode()


@pytest.fixture
async def sim():
    async with testing.running_sim(storm_fleet()) as running:
        yield running


def cordoned(sim):
    return sorted(n for n in NODES if sim.node(n)["spec"].get("unschedulable"))


@pytest.mark.timeout(240)
async def test_a_storm_stays_within_the_budget_trips_the_breaker_and_resumes_after_reset(
    make_harness, sim, clock
):
    notifier = FakeNotifier()
    rules = [
        (ROOT / "rules" / name).read_text()
        for name in ("gpu-xid-error.yaml", "return-node-to-service.yaml")
    ]
    h = await make_harness(
        *rules,
        notifier=notifier,
        kubernetes={"mode": "url", "url": sim.url, "token": sim.token},
        guards={"max_nodes": 3, "max_percent": 100, "max_disruptive_runs": 10, "recheck": "2s"},
    )
    for start in range(0, 50, 5):  # ten deliveries of five alerts, five seconds apart
        for node in NODES[start : start + 5]:
            assert (await h.post(xid_alert(node))).status == 200
        await h.settle()
        clock.advance(5)
    await h.settle()
    first = cordoned(sim)
    assert len(first) == 3
    breaker = await (await h.client.get("/api/v1/breaker")).json()
    assert breaker["open"] is True
    assert [n for n in notifier.sent if n["data"].get("event") == "breaker_opened"]
    runs = await h.runs()
    assert len(runs) == 50
    waiting = {"held by a guard": 0, "waiting for a concurrency slot": 0}
    for run in runs:
        steps = (await h.run_detail(run["id"]))["steps"]
        cordon = next(s for s in steps if s["key"] == "cordon")
        if cordon["status"] != "pending":
            continue
        if run["status"] == "pending":
            waiting["waiting for a concurrency slot"] += 1  # playbook concurrency (10)
        else:
            assert "held" in cordon["output"]
            waiting["held by a guard"] += 1
    assert sum(waiting.values()) == 47
    assert waiting["held by a guard"] == 7

    reset = await h.client.post("/api/v1/breaker/reset", json={"comment": "Xid storm seen"})
    assert reset.status == 200
    clock.advance(3)
    await h.settle()
    assert cordoned(sim) == first  # the budget is still in use: nothing more is disrupted

    # Two nodes are repaired: their drains are rejected and the runbook returns them.
    playbook = h.components.rules.index.get("return-node-to-service")
    for node in first[:2]:
        run = next(r for r in runs if r["node"] == node)
        waiting = [
            s for s in (await h.run_detail(run["id"]))["steps"] if s["status"] == "waiting_approval"
        ]
        await h.client.post(
            f"/api/v1/runs/{run['id']}/steps/{waiting[0]['id']}/reject",
            json={"comment": "repaired instead"},
        )
        await h.store.run(
            "trigger",
            lambda tx, node=node: lifecycle.create_manual_run(
                tx,
                playbook,
                h.components.registry,
                params={"node": node},
                node=node,
                principal="oncall",
                dry_run=False,
            ),
        )
    for _ in range(5):
        clock.advance(3)
        await h.settle()
    now = cordoned(sim)
    assert len(now) == 3
    assert not set(first[:2]) & set(now)
    assert (await (await h.client.get("/api/v1/breaker")).json())["open"] is False
