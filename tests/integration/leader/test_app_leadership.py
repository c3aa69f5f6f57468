"""Two apps on one Postgres: one leads (sweeper, retention), both take alerts and run steps;
when the leader's app stops, the other takes over."""

from __future__ import annotations

import asyncio

import pytest

import remediator.app as app_mod
from remediator.adapters import kubernetes
from remediator.app import settings as settings_mod
from remediator.sim import testing
from tests.conftest import am_fixture

# Long enough that each step of the election (an attempt, the release on a graceful stop:
# a third of the lease each) has room on a loaded machine, and that a takeover after a
# release (within one renew interval) is told from one after the lease expired.
LEASE = 6.0


def _settings(tmp_path, url, name, **extra):
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    return settings_mod.Settings(
        database_url=url,
        rules=rules,
        migrate_on_start=True,
        leader_lease_seconds=LEASE,
        worker_id=name,
        **extra,
    )


async def _wait(predicate, timeout):
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.fixture(params=["database", "kubernetes"])
async def election(request):
    """Settings selecting the lease: the Postgres row, or a Lease in the simulator."""
    if request.param == "database":
        yield {"leader_election": "database"}
        return
    async with testing.running_sim() as sim:
        yield {
            "leader_election": "kubernetes",
            "leader_lease_namespace": "default",
            "kubernetes": kubernetes.KubernetesConfig(
                mode="kubeconfig", kubeconfig=str(sim.kubeconfig_path)
            ),
        }


async def test_two_apps_on_postgres_elect_one_leader_and_both_take_alerts(
    aiohttp_client, pg_url, tmp_path, election
):
    apps = [app_mod.create_app(_settings(tmp_path, pg_url, f"r{i}", **election)) for i in range(2)]
    clients = [await aiohttp_client(app) for app in apps]
    components = [app[app_mod.COMPONENTS] for app in apps]
    # The first election waits for fresh connections; only the handover below is timed.
    await _wait(lambda: sum(c.is_leader() for c in components) == 1, LEASE * 2)
    leader_index = next(i for i, c in enumerate(components) if c.is_leader())
    follower = components[1 - leader_index]
    assert follower.engine.is_leader() is False
    assert components[leader_index].engine.is_leader() is True

    for client in clients:  # a follower still takes alerts
        response = await client.post(
            "/api/v1/alerts",
            data=am_fixture("GPUXidError79-firing-1alerts"),
            headers={"Content-Type": "application/json"},
        )
        assert response.status == 200

    metrics = [await (await c.get("/metrics")).text() for c in clients]
    assert "remediator_leader 1.0" in metrics[leader_index]
    assert "remediator_leader 0.0" in metrics[1 - leader_index]

    await clients[leader_index].close()  # graceful stop releases the lease
    await _wait(follower.is_leader, LEASE * 2 / 3)  # expiry would take the whole lease


def test_auto_picks_the_database_on_postgres_and_nobody_on_sqlite(tmp_path):
    def mode(**values):
        return app_mod.leader_mode(settings_mod.Settings(rules=tmp_path, **values))

    assert mode(database_url="postgresql+asyncpg://x@h/db") == "database"
    assert mode(database_url="sqlite+aiosqlite:///x.db") == "off"
    outside = kubernetes.KubernetesConfig(mode="url", url="http://127.0.0.1:1")
    assert mode(database_url="postgresql+asyncpg://x@h/db", kubernetes=outside) == "database"
    assert mode(leader_election="kubernetes", kubernetes=outside) == "kubernetes"
    with pytest.raises(SystemExit):
        mode(leader_election="kubernetes")
