"""App fixtures: the real aiohttp app on a real database, driven through aiohttp's test client."""

from __future__ import annotations

import pathlib
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import test_utils

import remediator.app as app_mod
from remediator.app import settings as settings_mod
from tests.support import recording


class Harness:
    def __init__(self, client: Any, components: app_mod.Components, record_path: pathlib.Path):
        self.client = client
        self.components = components
        self.engine = components.engine
        self.store = components.store
        self.record_path = record_path

    async def post(self, body: bytes, **headers: str) -> Any:
        return await self.client.post(
            "/api/v1/alerts",
            data=body,
            headers={"Content-Type": "application/json", **headers},
        )

    async def settle(self) -> None:
        await self.engine.settle()

    def records(self) -> list[dict[str, Any]]:
        return recording.read_records(self.record_path)

    async def run_detail(self, run_id: int) -> dict[str, Any]:
        response = await self.client.get(f"/api/v1/runs/{run_id}")
        assert response.status == 200, await response.text()
        return dict(await response.json())

    async def runs(self, **filters: str) -> list[dict[str, Any]]:
        response = await self.client.get("/api/v1/runs", params={"limit": "500", **filters})
        assert response.status == 200, await response.text()
        return list((await response.json())["items"])


def write_playbooks(directory: pathlib.Path, *texts: str) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    for number, text in enumerate(texts):
        (directory / f"p{number}.yaml").write_text(textwrap.dedent(text))
    return directory


@pytest.fixture
def make_harness(
    aiohttp_client: Any,
    database_url: str,
    tmp_path: pathlib.Path,
    clock: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., Any]:
    record_path = tmp_path / "records.jsonl"
    monkeypatch.setenv(recording.ENV, str(record_path))

    async def make(*playbooks: str, notifier: Any = None, **overrides: Any) -> Harness:
        rules = write_playbooks(tmp_path / "rules", *playbooks)
        values: dict[str, Any] = {
            "database_url": database_url,
            "rules": rules,
            "migrate_on_start": True,
            "lease_seconds": 5.0,
        } | overrides
        settings = settings_mod.Settings(**values)
        registry = app_mod.build_registry(["tests.support.recording"])
        app = app_mod.create_app(
            settings, clock=clock, registry=registry, notifier=notifier, run_engine=False
        )
        server = test_utils.TestServer(app)
        await server.start_server(**app_mod.SERVER_OPTIONS)
        client = await aiohttp_client(server)
        return Harness(client, app[app_mod.COMPONENTS], record_path)

    return make
