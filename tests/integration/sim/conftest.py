"""Fixtures starting the simulated cluster on an ephemeral port for integration tests.

Reuse from other test packages with ``pytest_plugins`` or by importing
``remediator.sim.testing`` directly (``async with testing.running_sim() as sim``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.stream import WsApiClient

from remediator.sim import testing


@pytest.fixture
async def sim_server() -> AsyncIterator[testing.RunningSim]:
    """The default fleet on 127.0.0.1:<ephemeral>, time running 100x faster."""
    async with testing.running_sim(time_scale=0.01) as sim:
        yield sim


def configuration(sim: testing.RunningSim) -> client.Configuration:
    cfg = client.Configuration(host=sim.url)
    cfg.api_key = {"BearerToken": sim.token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return cfg


@pytest.fixture
async def api_client(sim_server: testing.RunningSim) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(configuration=configuration(sim_server)) as api:
        yield api


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def policy(api_client: client.ApiClient) -> client.PolicyV1Api:
    return client.PolicyV1Api(api_client)


@dataclasses.dataclass
class ExecResult:
    stdout: bytes
    stderr: bytes
    status: dict[str, Any]

    @property
    def exit_code(self) -> int | None:
        if self.status.get("status") == "Success":
            return 0
        causes = (self.status.get("details") or {}).get("causes") or []
        codes = [int(c["message"]) for c in causes if c.get("reason") == "ExitCode"]
        return codes[0] if codes else None

    @property
    def text(self) -> str:
        return self.stdout.decode()


ExecFn = Callable[..., Awaitable[ExecResult]]


@pytest.fixture
async def exec_pod(sim_server: testing.RunningSim) -> AsyncIterator[ExecFn]:
    """``await exec_pod(namespace, pod, [argv], container=...)`` over the real WsApiClient."""
    async with WsApiClient(configuration=configuration(sim_server)) as ws_api:
        core = client.CoreV1Api(ws_api)

        async def run(
            namespace: str,
            pod: str,
            argv: list[str],
            *,
            container: str | None = None,
            timeout: float = 10,
        ) -> ExecResult:
            kwargs: dict[str, Any] = {"container": container} if container else {}
            connect = await core.connect_get_namespaced_pod_exec(
                pod,
                namespace,
                command=argv,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                _preload_content=False,
                **kwargs,
            )
            out, err, status = bytearray(), bytearray(), {}
            async with asyncio.timeout(timeout), connect as ws:
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                        continue
                    channel, payload = msg.data[0], msg.data[1:]
                    if channel == 1:
                        out += payload
                    elif channel == 2:
                        err += payload
                    elif channel == 3:
                        status = json.loads(payload)
            return ExecResult(bytes(out), bytes(err), status)

        yield run


async def exec_driver(
    exec_pod: ExecFn, sim: testing.RunningSim, node: str, argv: list[str], **kwargs: Any
) -> ExecResult:
    pod = sim.driver_pod(node)
    return await exec_pod(
        "gpu-operator", pod["metadata"]["name"], argv, container="nvidia-driver-ctr", **kwargs
    )


@pytest.fixture
def driver_exec(exec_pod: ExecFn, sim_server: testing.RunningSim) -> ExecFn:
    """``await driver_exec(node, [argv])``: exec in the GPU driver container on ``node``."""

    async def run(node: str, argv: list[str], **kwargs: Any) -> ExecResult:
        return await exec_driver(exec_pod, sim_server, node, argv, **kwargs)

    return run
