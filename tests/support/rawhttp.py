"""A small HTTP/1.1 client that sends requests byte for byte as given (header values and paths
that no ordinary client would send) and times the answer.

One request per connection (``Connection: close``). The body is written while the answer is
read, so a server that answers before reading the body (and then hangs up) is heard.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time


@dataclasses.dataclass(frozen=True)
class Wire:
    """One request as bytes. ``length`` overrides the Content-Length sent (``None``: the body's
    length; ``-1``: none at all); ``chunked`` sends the body with chunked transfer encoding."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    host: bytes | None = b"127.0.0.1"
    length: int | None = None
    chunked: bool = False

    def describe(self, limit: int = 300) -> str:
        head = b" ".join([self.method, self.target[:200]])
        names = b",".join(name for name, _ in self.headers)
        return f"{head!r} headers=[{names!r}] body={len(self.body)}B {self.body[:limit]!r}"


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (the connection closed or reset first)
    elapsed: float
    body: bytes = b""
    error: str = ""


def encode(wire: Wire, port: int) -> tuple[bytes, bytes]:
    """The head and the body as they go on the wire."""
    lines = [wire.method + b" " + wire.target + b" HTTP/1.1"]
    if wire.host is not None:
        lines.append(b"Host: " + wire.host + b":" + str(port).encode())
    lines.append(b"Connection: close")
    lines += [name + b": " + value for name, value in wire.headers]
    body = wire.body
    if wire.chunked:
        lines.append(b"Transfer-Encoding: chunked")
        body = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    elif wire.length != -1 and (body or wire.method not in (b"GET", b"HEAD")):
        lines.append(
            b"Content-Length: " + str(len(body) if wire.length is None else wire.length).encode()
        )
    return b"\r\n".join(lines) + b"\r\n\r\n", body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def read_answer(reader: asyncio.StreamReader, method: bytes) -> tuple[int, bytes]:
    """Status and body of the next final answer (1xx answers are skipped)."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        if status >= 200:
            break
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if method == b"HEAD" or status in (204, 304):
        return status, b""
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        return status, await _read_chunked(reader)
    if b"content-length" in headers:
        return status, await reader.readexactly(int(headers[b"content-length"]))
    return status, await reader.read()


async def _send_body(sock: socket.socket, body: bytes) -> None:
    with contextlib.suppress(OSError):  # the server answered and hung up before taking all
        await asyncio.get_running_loop().sock_sendall(sock, body)


async def _receive(sock: socket.socket, reader: asyncio.StreamReader) -> None:
    """Everything the server sends, until it closes or resets the connection: a reset after
    the answer (a server hanging up on a body it will not read) still leaves the answer."""
    loop = asyncio.get_running_loop()
    try:
        while data := await loop.sock_recv(sock, 65536):
            reader.feed_data(data)
    except OSError:
        pass
    reader.feed_eof()


async def send(wire: Wire, *, port: int, local: str = "127.0.0.1", timeout: float = 5.0) -> Answer:
    """Send ``wire`` to 127.0.0.1:``port`` from address ``local``; the answer and how long the
    whole exchange took (connect to the end of the answer's body).

    Plain socket calls rather than streams: a write that fails because the server hung up must
    not throw away an answer that already arrived."""
    started = time.monotonic()
    head, body = encode(wire, port)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    tasks: list[asyncio.Task[None]] = []
    try:
        async with asyncio.timeout(timeout):
            sock.bind((local, 0))
            await loop.sock_connect(sock, ("127.0.0.1", port))
            reader = asyncio.StreamReader(limit=1 << 20)
            tasks.append(asyncio.create_task(_receive(sock, reader)))
            await loop.sock_sendall(sock, head)
            tasks.append(asyncio.create_task(_send_body(sock, body)))
            status, answer = await read_answer(reader, wire.method)
        return Answer(status, time.monotonic() - started, answer)
    except TimeoutError:
        return Answer(0, time.monotonic() - started, error=f"no answer within {timeout:g} s")
    except (OSError, EOFError, asyncio.LimitOverrunError, ValueError, IndexError) as e:
        return Answer(0, time.monotonic() - started, error=repr(e)[:200])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sock.close()
