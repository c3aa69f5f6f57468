"""Fixtures starting the simulated cluster on an ephemeral port for integration tests.

Reuse from other test packages with ``pytest_plugins`` or by importing
``remediator.sim.testing`` directly (``async with testing.running_sim() as sim``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

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
