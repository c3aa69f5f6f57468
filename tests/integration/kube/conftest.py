"""The real Kubernetes adapter (kubernetes_asyncio over HTTP and websockets) against the
simulator started in-process, and ActionContexts built the way the engine builds them."""

from __future__ import annotations

import datetime as dt
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from remediator.adapters import kubernetes
from remediator.ports import actions
from remediator.ports import cluster as port
from remediator.sim import testing
from tests.support.notify import FakeNotifier


@pytest.fixture
async def sim() -> AsyncIterator[testing.RunningSim]:
    async with testing.running_sim(time_scale=0.01) as running:
        yield running


def kube_config(sim: testing.RunningSim, **overrides: Any) -> kubernetes.KubernetesConfig:
    values: dict[str, Any] = {
        "mode": "kubeconfig",
        "kubeconfig": str(sim.kubeconfig_path),
        "retry_max_seconds": 10.0,
    }
    return kubernetes.KubernetesConfig.model_validate(values | overrides)


@pytest.fixture
async def cluster(sim: testing.RunningSim) -> AsyncIterator[kubernetes.KubeCluster]:
    kube = await kubernetes.connect(kube_config(sim))
    try:
        yield kube
    finally:
        await kube.close()


class Progress:
    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []

    async def __call__(self, update: dict[str, Any]) -> None:
        self.updates.append(dict(update))


MakeContext = Callable[..., actions.ActionContext]


@pytest.fixture
def make_ctx(cluster: port.Cluster, tmp_path: pathlib.Path) -> MakeContext:
    def make(
        *,
        node: str | None = "gpu-node-01",
        gpu: str | None = None,
        run_id: int = 7,
        step_id: int = 3,
        applied_output: dict[str, Any] | None = None,
        progress: Progress | None = None,
        kube: port.Cluster | None = None,
    ) -> actions.ActionContext:
        return actions.ActionContext(
            run_id=run_id,
            step_id=step_id,
            step_key="step",
            attempt=1,
            playbook="gpu-xid-79",
            node=node,
            gpu=gpu,
            labels={},
            annotations={},
            dry_run=False,
            now=lambda: dt.datetime.now(dt.UTC),
            notifier=FakeNotifier(),
            cluster=kube or cluster,
            services={"artifact_dir": tmp_path / "artifacts"},
            progress=progress or Progress(),
            applied_output=applied_output or {},
        )

    return make


async def run_action(
    action: actions.Action[Any], ctx: actions.ActionContext, params: dict[str, Any]
) -> dict[str, Any]:
    """check → apply, as the engine does."""
    parsed = action.parse(params)
    check = await action.check(ctx, parsed)
    if check.in_place:
        return {"already_in_place": True, **check.output}
    return await action.apply(ctx, parsed)


async def run_undo(
    action: actions.Action[Any], ctx: actions.ActionContext, params: dict[str, Any]
) -> dict[str, Any]:
    parsed = action.parse(params)
    check = await action.check_undo(ctx, parsed)
    if check.in_place:
        return {"already_in_place": True, **check.output}
    return await action.undo(ctx, parsed)


def node_events(sim: testing.RunningSim, node: str) -> list[dict[str, Any]]:
    return [
        e
        for e in sim.store.list("events", None)
        if e["involvedObject"].get("kind") == "Node" and e["involvedObject"]["name"] == node
    ]
