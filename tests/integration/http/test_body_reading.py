"""``hygiene.read_body``: a body already in full in the buffer is taken at once; one still
arriving is read within the size and time limits. Both ways give the same answers."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from remediator.adapters.http import errors as http_errors
from remediator.adapters.http import hygiene

LIMIT = 1000


async def _read(request: web.Request) -> web.Response:
    arrived = request.content.is_eof()  # whether read_body can take the body at once
    body = await hygiene.read_body(request, limit=LIMIT)
    return web.json_response({"arrived": arrived, "size": len(body), "head": body[:8].decode()})


async def _server(aiohttp_client):
    app = web.Application(middlewares=[hygiene.middleware, http_errors.error_middleware])
    app[hygiene.LIMITS] = hygiene.Limits(body_read_timeout=0.3)
    app.router.add_post("/read", _read)
    return await aiohttp_client(app)


async def _send(client, parts, *, chunked, pause=0.0):
    """POST the parts (with a pause before each but the first); status, body, Connection."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        framing = (
            b"Transfer-Encoding: chunked"
            if chunked
            else b"Content-Length: %d" % sum(map(len, parts))
        )
        writer.write(b"POST /read HTTP/1.1\r\nHost: localhost\r\n" + framing + b"\r\n\r\n")
        for index, part in enumerate(parts):
            if index and pause:
                await writer.drain()
                await asyncio.sleep(pause)
            writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        if chunked and parts:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        body = await reader.readexactly(int(headers["content-length"]))
        return int(lines[0].split()[1]), json.loads(body), headers.get("connection")
    finally:
        writer.close()


async def test_whole_and_trickling_bodies_read_the_same(aiohttp_client):
    client = await _server(aiohttp_client)
    parts = [b"abcdefgh", b"x" * 300, b"y" * 300]
    for chunked in (False, True):
        status, body, _ = await _send(client, parts, chunked=chunked)
        assert (status, body) == (200, {"arrived": True, "size": 608, "head": "abcdefgh"})
        status, body, _ = await _send(client, parts, chunked=chunked, pause=0.05)
        assert (status, body) == (200, {"arrived": False, "size": 608, "head": "abcdefgh"})


async def test_bodies_above_the_limit_are_413_whole_or_trickling(aiohttp_client):
    client = await _server(aiohttp_client)
    parts = [b"x" * 600, b"y" * 600]
    for pause in (0.0, 0.05):
        status, body, _ = await _send(client, parts, chunked=True, pause=pause)
        assert (status, body["error"]["code"]) == (413, "too_large")
        assert body["error"]["message"] == f"body above {LIMIT} bytes"
        status, body, _ = await _send(client, parts, chunked=False, pause=pause)
        assert (status, body["error"]["code"]) == (413, "too_large")


async def test_a_body_that_stops_arriving_is_408_and_the_connection_closes(aiohttp_client):
    client = await _server(aiohttp_client)
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(b"POST /read HTTP/1.1\r\nHost: localhost\r\nContent-Length: 500\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 3)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert b"Connection: close" in head
    assert json.loads(body)["error"] == {
        "code": "timeout",
        "message": "the body did not arrive within 0.3 s",
    }
