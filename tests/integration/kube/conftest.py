"""The real Kubernetes adapter (kubernetes_asyncio over HTTP and websockets) against the
simulator started in-process, and ActionContexts built the way the engine builds them."""

from __future__ import annotations

import datetime as dt
import pathlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

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


Connect = Callable[..., Awaitable[kubernetes.KubeCluster]]


@pytest.fixture
async def connect(sim: testing.RunningSim) -> AsyncIterator[Connect]:
    """``await connect(retry_max_seconds=0.5)``: another client, with other settings."""
    opened: list[kubernetes.KubeCluster] = []

    async def make(**overrides: Any) -> kubernetes.KubeCluster:
        opened.append(await kubernetes.connect(kube_config(sim, **overrides)))
        return opened[-1]

    yield make
    for kube in opened:
        await kube.close()


async def set_faults(sim: testing.RunningSim, body: dict[str, object]) -> None:
    """Fault injection rules (``remediator.sim.faults``), through the simulator's admin API."""
    async with (
        aiohttp.ClientSession(headers=sim.headers) as http,
        http.put(f"{sim.url}/sim/v1/faults", json=body) as resp,
    ):
        assert resp.status == 200


async def stop_listening(sim: testing.RunningSim) -> None:
    """The API server goes away: its port refuses connections and open ones are cut.
    The simulated cluster keeps its state for ``start_listening``."""
    for site in list(sim.runner.sites):
        await site.stop()
    server = sim.runner.server
    for handler in server.connections if server is not None else []:
        handler.force_close()


async def start_listening(sim: testing.RunningSim) -> None:
    """The API server is back, on the same address."""
    url = urllib.parse.urlsplit(sim.url)
    await web.TCPSite(sim.runner, url.hostname, url.port).start()


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
