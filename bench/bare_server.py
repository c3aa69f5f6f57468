"""The baseline: a bare aiohttp server doing one durable SQLite insert per request.

Same stack as remediator (aiohttp, aiosqlite, WAL, synchronous=FULL), no validation, no
dedupe, no group commit: the cost of "store the body durably, then answer".
"""

from __future__ import annotations

import asyncio
import sys

import aiosqlite
from aiohttp import web


async def main(path: str, port: int) -> None:
    db = await aiosqlite.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL"):
        await db.execute(f"PRAGMA {pragma}")
    await db.execute("CREATE TABLE IF NOT EXISTS deliveries (id INTEGER PRIMARY KEY, body TEXT)")
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
    app.router.add_get("/readyz", lambda _: web.json_response({"status": "ready"}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
