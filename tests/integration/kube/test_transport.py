"""Transport retries against the simulator's fault injection, configuration modes, events."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client import exceptions as k8s_exceptions

from remediator.actions import pods
from remediator.adapters import kubernetes
from remediator.adapters.kubernetes import transport
from remediator.ports import cluster as port
from remediator.sim import testing
from tests.integration.kube.conftest import (
    MakeContext,
    kube_config,
    node_events,
    run_action,
    set_faults,
)


@pytest.mark.parametrize("fault", [{"rate_503": 0.5}, {"rate_429": 0.5}])
async def test_injected_429_and_503_are_retried_until_the_call_succeeds(
    sim: testing.RunningSim,
    cluster: port.Cluster,
    caplog: pytest.LogCaptureFixture,
    fault: dict[str, float],
) -> None:
    await set_faults(sim, {"rules": [{"path_prefix": "/api/", **fault}], "seed": 3})
    caplog.set_level(logging.WARNING, "remediator.adapters.kubernetes")
    for _ in range(4):
        node = await cluster.get_node("gpu-node-01")
        assert node.name == "gpu-node-01"
    assert any("retrying" in r.getMessage() for r in caplog.records)


async def test_retries_are_bounded_and_end_in_a_translated_error(
    sim: testing.RunningSim,
) -> None:
    await set_faults(sim, {"rules": [{"path_prefix": "/api/", "rate_503": 1.0}]})
    kube = await kubernetes.connect(kube_config(sim, retry_attempts=3))
    try:
        with pytest.raises(port.Unavailable) as info:
            await kube.get_node("gpu-node-01")
    finally:
        await kube.close()
    assert info.value.status == 503
    assert info.value.temporary is True
    assert info.value.__cause__ is not None


async def test_not_found_is_not_retried(cluster: port.Cluster) -> None:
    with pytest.raises(port.NotFound):
        await cluster.get_node("no-such-node")


async def test_url_and_token_mode_reaches_the_api(sim: testing.RunningSim) -> None:
    kube = await kubernetes.connect(
        kubernetes.KubernetesConfig(mode="url", url=sim.url, token=sim.token)
    )
    try:
        nodes = await kube.list_nodes(kube.gpu_node_selector)
    finally:
        await kube.close()
    assert sorted(n.name for n in nodes) == [f"gpu-node-0{i}" for i in range(1, 5)]


async def test_event_action_records_an_event_on_the_node(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    params = {"reason": "GPUXidError", "message": "Xid 79 on GPU 5", "type": "Warning"}
    output = await run_action(pods.EventAction(), make_ctx(node="gpu-node-02"), params)
    [event] = node_events(sim, "gpu-node-02")
    assert event["metadata"]["name"] == output["event"]
    assert event["type"] == "Warning"
    assert event["source"]["component"] == "remediator"
    assert event["message"].startswith("Xid 79 on GPU 5 (remediator run 7")


async def test_connection_failures_and_5xx_are_temporary_and_other_answers_are_not() -> None:
    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None),
        OSError(111, "Connection refused"),
    )
    assert transport.is_transient(refused)
    assert transport.translate(refused, "get node").temporary is True
    assert transport.translate(aiohttp.ServerDisconnectedError(), "get node").temporary is True
    gateway = k8s_exceptions.ApiException(status=504, reason="Gateway Timeout")
    assert transport.translate(gateway, "get node").temporary is True
    unbuildable = k8s_exceptions.ApiException(status=0, reason="Cannot prepare a request")
    assert not transport.is_transient(unbuildable)
    assert transport.translate(unbuildable, "get node").temporary is False


async def test_answers_are_read_as_plain_json_never_as_the_clients_models(
    sim: testing.RunningSim, cluster: port.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the client's model objects (dates parsed, every field typed) and turning them
    back into dicts cost seconds of CPU on the event loop for a list of a thousand nodes, and a
    tenth of the engine's CPU on single reads and patches: answers are read as JSON."""

    def no_models(*args: object, **kwargs: object) -> None:
        raise AssertionError("an answer was deserialized into model objects")

    monkeypatch.setattr(ApiClient, "deserialize", no_models)
    nodes = await cluster.list_nodes(cluster.gpu_node_selector)
    assert "gpu-node-01" in [node.name for node in nodes]
    patched = await cluster.patch_node("gpu-node-01", labels={"checked": "yes"})
    assert (
        (await cluster.get_node("gpu-node-01")).labels["checked"]
        == "yes"
        == patched.labels["checked"]
    )
    pods = await cluster.list_pods(field_selector="spec.nodeName=gpu-node-01")
    assert pods
    assert all(pod.node_name == "gpu-node-01" for pod in pods)
    await set_faults(sim, {"rules": [{"path_prefix": "/api/v1/nodes", "rate_503": 1.0}]})
    with pytest.raises(port.Unavailable) as info:
        await cluster.list_nodes()
    assert (info.value.status, info.value.temporary) == (503, True)


@pytest.mark.parametrize("proxy", [None, "HTTPS_PROXY", "http_proxy"])
async def test_the_environment_is_read_per_request_only_when_it_names_a_proxy(
    sim: testing.RunningSim, monkeypatch: pytest.MonkeyPatch, proxy: str | None
) -> None:
    """aiohttp's ``trust_env`` looked for proxies and read ``.netrc`` on a thread for every
    request; without a proxy variable the client's session does not, and still works."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    if proxy is not None:
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    kube = await kubernetes.connect(kube_config(sim))
    try:
        session = kube._api.rest_client.pool_manager
        assert session.trust_env is (proxy is not None)
        assert (await kube.get_node("gpu-node-01")).name == "gpu-node-01"
    finally:
        await kube.close()


async def test_lists_are_read_in_pages(
    sim: testing.RunningSim, cluster: port.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kubectl does: a 5,000-node list read as one answer was a quarter of a second of
    JSON on the event loop, with every webhook and step behind it."""
    every = [node.name for node in await cluster.list_nodes()]
    assert len(every) > 2
    monkeypatch.setattr(cluster, "page_size", 2)
    sim.cluster.requests.clear()
    assert [node.name for node in await cluster.list_nodes()] == every
    assert sim.cluster.requests["list nodes"] == -(-len(every) // 2)
