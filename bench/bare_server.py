"""The baselines: a bare aiohttp server storing each Alertmanager delivery durably in SQLite
(WAL, ``synchronous=FULL``, same as remediator), then answering.

    python -m bench.bare_server PATH PORT [per-request|group-commit]

- ``per-request`` (default): one aiosqlite insert and commit per request, no validation, no
  dedupe: the cost of "store the body durably, then answer" the naive way.
- ``group-commit``: the body validated with pydantic (the Alertmanager webhook model), then
  queued; one writer thread commits everything queued so far in one transaction (one fsync)
  and answers all of those requests. The fair ceiling for remediator's intake: same stack,
  same durability, nothing else to do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import sys
from typing import Any

import aiosqlite
import pydantic
from aiohttp import web

PRAGMAS = ("journal_mode=WAL", "synchronous=FULL")
SCHEMA = "CREATE TABLE IF NOT EXISTS deliveries (id INTEGER PRIMARY KEY, body TEXT)"


class Alert(pydantic.BaseModel):
    status: str
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class Delivery(pydantic.BaseModel):
    version: str = "4"
    groupKey: str = ""
    truncatedAlerts: int = 0
    status: str
    receiver: str
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = ""
    alerts: list[Alert]


async def per_request(path: str) -> web.Application:
    db = await aiosqlite.connect(path, isolation_level=None)
    for pragma in PRAGMAS:
        await db.execute(f"PRAGMA {pragma}")
    await db.execute(SCHEMA)
    lock = asyncio.Lock()

    async def receive(request: web.Request) -> web.Response:
        body = await request.text()
        async with lock:
            await db.execute("BEGIN IMMEDIATE")
            await db.execute("INSERT INTO deliveries (body) VALUES (?)", (body,))
            await db.execute("COMMIT")
        return web.json_response({"status": "stored"})

    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_post("/api/v1/alerts", receive)
    return app


class GroupCommit:
    """Queued bodies, committed by one writer thread in batches of whatever has queued up."""

    def __init__(self, path: str) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="writer")
        self.queue: list[tuple[str, asyncio.Future[None]]] = []
        self.wake = asyncio.Event()
        self.db = self.pool.submit(self._open, path).result()

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in PRAGMAS:
            db.execute(f"PRAGMA {pragma}")
        db.execute(SCHEMA)
        return db

    def _commit(self, bodies: list[str]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT INTO deliveries (body) VALUES (?)", [(b,) for b in bodies])
        self.db.execute("COMMIT")

    async def store(self, body: str) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append((body, done))
        self.wake.set()
        await done

    async def writer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.queue = self.queue, []
            if not batch:
                continue
            try:
                await loop.run_in_executor(self.pool, self._commit, [b for b, _ in batch])
            except Exception as e:  # every waiter learns of it
                for _, done in batch:
                    done.set_exception(e)
                continue
            for _, done in batch:
                done.set_result(None)


async def group_commit(path: str) -> web.Application:
    store = GroupCommit(path)

    async def receive(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            delivery = Delivery.model_validate_json(raw)
        except pydantic.ValidationError as e:
            return web.json_response({"error": str(e)}, status=400)
        await store.store(raw.decode())
        return web.json_response({"status": "stored", "alerts": len(delivery.alerts)})

    async def writer(app: web.Application) -> Any:
        task = asyncio.create_task(store.writer())
        yield
        task.cancel()

    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_post("/api/v1/alerts", receive)
    app.cleanup_ctx.append(writer)
    return app


async def main(path: str, port: int, mode: str = "per-request") -> None:
    app = await (group_commit(path) if mode == "group-commit" else per_request(path))
    app.router.add_get("/readyz", lambda _: web.json_response({"status": "ready"}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4]))
