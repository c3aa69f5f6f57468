"""Plain HTTP and kubectl: kubectl sends no credentials over plain HTTP, so a simulator that
serves anonymous requests lets it in; a wrong token is refused all the same."""

from __future__ import annotations

import httpx

from remediator.sim import testing


async def _status(sim: testing.RunningSim, headers: dict[str, str]) -> int:
    async with httpx.AsyncClient(base_url=sim.url) as client:
        return (await client.get("/api/v1/nodes", headers=headers)).status_code


async def test_an_anonymous_simulator_serves_requests_without_a_token_but_not_a_wrong_one():
    async with testing.running_sim(anonymous=True) as sim:
        assert await _status(sim, {}) == 200
        assert await _status(sim, sim.headers) == 200
        assert await _status(sim, {"Authorization": "Bearer wrong"}) == 401


async def test_a_simulator_needs_its_token_by_default():
    async with testing.running_sim() as sim:
        assert await _status(sim, {}) == 401
        assert await _status(sim, sim.headers) == 200
