"""The shipped playbooks (rules/) end to end: real Alertmanager bodies → intake → engine →
actions through the real Kubernetes adapter → the simulated GPU cluster, on SQLite and Postgres.
"""

from __future__ import annotations

import copy
import json
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from remediator.engine import lifecycle
from remediator.sim import testing
from tests.conftest import ROOT, am_payload
from tests.integration.conftest import Harness
from tests.support.notify import FakeNotifier

RULES = ROOT / "rules"


@pytest.fixture
async def sim() -> AsyncIterator[testing.RunningSim]:
    async with testing.running_sim(time_scale=0.01) as running:
        yield running


@pytest.fixture
def notifier() -> FakeNotifier:
    return FakeNotifier()


MakeGpuHarness = Callable[..., Any]


@pytest.fixture
def gpu_harness(
    make_harness: Any, sim: testing.RunningSim, notifier: FakeNotifier, tmp_path: pathlib.Path
) -> MakeGpuHarness:
    """The app with the shipped rules/, acting on the simulator."""

    token_file = tmp_path / "reboot-hook-token"
    token_file.write_text(sim.token)

    async def make(**overrides: Any) -> Harness:
        kubernetes = {
            "mode": "url",
            "url": sim.url,
            "token": sim.token,
            "retry_max_seconds": 5.0,
        }
        values = {
            "rules": RULES,
            "kubernetes": kubernetes,
            "artifact_dir": tmp_path / "artifacts",
            # The default budget (10 % of GPU nodes, rounded up) is 1 node of the 4-GPU-node
            # simulated fleet; these tests take nodes out without waiting for returns.
            "guards": {"max_percent": 50.0},
            # node.reboot through the simulator's reboot hook (the host comes back in 0.6 s).
            "reboot": {
                "method": "hook",
                "hook_url": f"{sim.url}/sim/v1/reboots",
                "hook_token_file": token_file,
            },
        } | overrides
        harness: Harness = await make_harness(notifier=notifier, **values)
        return harness

    return make


def body(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def fixture(name: str) -> bytes:
    """A captured Alertmanager 0.25 body, re-serialised unchanged."""
    return body(am_payload(name))


def built(
    base: str,
    *,
    alertname: str,
    set_labels: dict[str, str] | None = None,
    drop_labels: tuple[str, ...] = (),
    summary: str,
    fingerprint: str,
    status: str = "firing",
    starts_at: str | None = None,
) -> bytes:
    """A body in the shape of the captured ``base`` for an alert without a captured fixture."""
    payload = copy.deepcopy(am_payload(base))
    alert = payload["alerts"][0]
    payload["alerts"] = [alert]
    labels = {k: v for k, v in alert["labels"].items() if k not in drop_labels}
    labels |= {"alertname": alertname, **(set_labels or {})}
    alert["labels"] = labels
    alert["annotations"] = {"summary": summary, "description": summary + "."}
    alert["fingerprint"] = fingerprint
    alert["status"] = status
    if starts_at:
        alert["startsAt"] = starts_at
    alert["endsAt"] = "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T00:09:00Z"
    payload["status"] = status
    payload["commonLabels"] = dict(labels)
    payload["commonAnnotations"] = dict(alert["annotations"])
    payload["groupLabels"] = {"alertname": alertname, "node": labels["node"]}
    payload["groupKey"] = f'{{}}:{{alertname="{alertname}", node="{labels["node"]}"}}'
    return body(payload)


async def post(h: Harness, data: bytes) -> None:
    response = await h.post(data)
    assert response.status == 200, await response.text()
    await h.settle()


async def only_run(h: Harness, **filters: str) -> dict[str, Any]:
    found = await h.runs(**filters)
    assert len(found) == 1, found
    return await h.run_detail(found[0]["id"])


def step(detail: dict[str, Any], key: str) -> dict[str, Any]:
    return next(s for s in detail["steps"] if s["key"] == key)


def statuses(detail: dict[str, Any]) -> dict[str, str]:
    return {s["key"]: s["status"] for s in detail["steps"]}


async def approve(h: Harness, detail: dict[str, Any], key: str, comment: str = "go") -> int:
    url = f"/api/v1/runs/{detail['id']}/steps/{step(detail, key)['id']}/approve"
    response = await h.client.post(url, json={"comment": comment})
    status: int = response.status
    if status == 200:
        await h.settle()
    return status


async def trigger(h: Harness, playbook: str, params: dict[str, Any], node: str | None) -> int:
    """A manual run as the trigger endpoint will create it."""
    spec = h.components.rules.index.get(playbook)
    assert spec is not None
    run_id: int = await h.store.run(
        "trigger",
        lambda tx: lifecycle.create_manual_run(
            tx,
            spec,
            h.components.registry,
            params=params,
            node=node,
            principal="alice",
            dry_run=False,
        ),
    )
    await h.settle()
    return run_id


def node_events(sim: testing.RunningSim, node: str) -> list[str]:
    return [
        e["reason"]
        for e in sim.store.list("events", None)
        if e["involvedObject"].get("kind") == "Node" and e["involvedObject"]["name"] == node
    ]


def taint_keys(sim: testing.RunningSim, node: str) -> set[str]:
    return {t["key"] for t in sim.node(node)["spec"].get("taints") or []}


def labels(sim: testing.RunningSim, node: str) -> dict[str, str]:
    return dict(sim.node(node)["metadata"].get("labels") or {})


def cordoned(sim: testing.RunningSim, node: str) -> bool:
    return bool(sim.node(node)["spec"].get("unschedulable"))


def pod_uids(sim: testing.RunningSim, node: str) -> dict[str, str]:
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["uid"]
        for p in sim.pods(node=node)
    }
