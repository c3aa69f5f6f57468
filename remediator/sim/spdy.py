"""Just enough SPDY/3.1 for ``kubectl exec`` from kubectl releases that predate websockets.

client-go's SPDY executor (remotecommand v4) upgrades the POST with ``Upgrade: SPDY/3.1``,
then opens one SPDY stream per channel, each tagged by a ``streamType`` header (error, stdin,
stdout, stderr, resize) and each waiting for a SYN_REPLY. The server writes output as data
frames on those streams, the ``metav1.Status`` JSON on the error stream, and FIN on each.

Frames (draft-mbelshe-httpbis-spdy-00): control frames start with the high bit set, a 15-bit
version (3) and a 16-bit type; data frames start with a 31-bit stream id. Header blocks are
zlib-compressed with one stream per direction, primed with the SPDY/3 dictionary. Flow
control is not enforced (spdystream, client-go's library, does not enforce it either).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import zlib

from aiohttp import web

from remediator.sim import cluster as cluster_mod
from remediator.sim import commands

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY = 1, 2, 3, 4, 6, 7
FLAG_FIN = 0x01
PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
_WORDS = (
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
)
_TAIL = (
    b"100101201202205206300302303304305306307402405406407408409410411412413414415416417502504"
    b"505203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    b"401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    b"503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, "
    b"Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    b"application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    b"gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.encode() for w in _WORDS) + _TAIL
assert len(DICTIONARY) == 1423


class Session:
    """One upgraded connection; doubles as the payload parser aiohttp feeds bytes into."""

    def __init__(self, transport: asyncio.BaseTransport | None) -> None:
        self.transport = transport
        self.inflate = zlib.decompressobj(zdict=DICTIONARY)
        self.deflate = zlib.compressobj(zdict=DICTIONARY)
        self.buffer = bytearray()
        self.streams: dict[str, int] = {}
        self.changed = asyncio.Event()
        self.closed = asyncio.Event()

    # -- the aiohttp payload-parser interface ----------------------------------------------

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.buffer += data
        while len(self.buffer) >= 8:
            length = int.from_bytes(self.buffer[5:8], "big")
            if len(self.buffer) < 8 + length:
                break
            frame = bytes(self.buffer[: 8 + length])
            del self.buffer[: 8 + length]
            if frame[0] & 0x80:
                self._control(frame)
        return False, b""

    def feed_eof(self) -> None:
        self.closed.set()
        self.changed.set()

    # -- frames ----------------------------------------------------------------------------

    def _control(self, frame: bytes) -> None:
        kind = int.from_bytes(frame[2:4], "big")
        data = frame[8:]
        if kind == SYN_STREAM:
            stream_id = int.from_bytes(data[0:4], "big") & 0x7FFFFFFF
            headers = self._decode_headers(data[10:])
            self.streams[headers.get("streamtype", "")] = stream_id
            self._send_control(SYN_REPLY, 0, struct.pack(">I", stream_id) + self._encode({}))
            self.changed.set()
        elif kind == PING:
            self._write(frame)
        elif kind == GOAWAY:
            self.feed_eof()

    def _decode_headers(self, block: bytes) -> dict[str, str]:
        raw = self.inflate.decompress(block)
        (count,), pos = struct.unpack(">I", raw[:4]), 4
        headers: dict[str, str] = {}
        for _ in range(count):
            (klen,) = struct.unpack(">I", raw[pos : pos + 4])
            key = raw[pos + 4 : pos + 4 + klen].decode().lower()
            pos += 4 + klen
            (vlen,) = struct.unpack(">I", raw[pos : pos + 4])
            headers[key] = raw[pos + 4 : pos + 4 + vlen].decode()
            pos += 4 + vlen
        return headers

    def _encode(self, headers: dict[str, str]) -> bytes:
        raw = struct.pack(">I", len(headers))
        for key, value in headers.items():
            raw += struct.pack(">I", len(key)) + key.encode()
            raw += struct.pack(">I", len(value)) + value.encode()
        return self.deflate.compress(raw) + self.deflate.flush(zlib.Z_SYNC_FLUSH)

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if isinstance(transport, asyncio.WriteTransport) and not transport.is_closing():
            transport.write(data)

    def _send_control(self, kind: int, flags: int, data: bytes) -> None:
        self._write(struct.pack(">HHI", 0x8003, kind, (flags << 24) | len(data)) + data)

    def send_data(self, stream_type: str, data: bytes, *, fin: bool = False) -> None:
        stream_id = self.streams.get(stream_type)
        if stream_id is None:
            return
        for start in range(0, max(len(data), 1), 32 * 1024):
            chunk = data[start : start + 32 * 1024]
            last = fin and start + 32 * 1024 >= len(data)
            flags = FLAG_FIN if last else 0
            self._write(struct.pack(">II", stream_id, (flags << 24) | len(chunk)) + chunk)

    def goaway(self) -> None:
        self._send_control(GOAWAY, 0, struct.pack(">II", 0, 0))

    async def wait_for_streams(self, wanted: set[str], timeout: float) -> bool:
        async with asyncio.timeout(timeout):
            while not wanted <= set(self.streams):
                if self.closed.is_set():
                    return False
                self.changed.clear()
                await self.changed.wait()
        return True


def _wanted_streams(request: web.Request) -> set[str]:
    wanted = {"error"}
    for name in ("stdout", "stderr", "stdin"):
        if request.query.get(name, "").lower() in ("true", "1"):
            wanted.add(name)
    return wanted


async def handle(
    request: web.Request, ctx: commands.Context, record: cluster_mod.ExecRecord
) -> web.StreamResponse:
    offered = [
        p.strip()
        for value in request.headers.getall("X-Stream-Protocol-Version", [])
        for p in value.split(",")
    ]
    protocol = next((p for p in PROTOCOLS if p in offered), "channel.k8s.io")
    record.transport = f"spdy:{protocol}"
    session = Session(request.transport)
    # aiohttp feeds an upgraded connection to any object with feed_data/feed_eof.
    request.protocol.set_parser(session)  # type: ignore[arg-type]
    request.protocol.keep_alive(False)
    response = web.StreamResponse(
        status=101,
        reason="Switching Protocols",
        headers={
            "Connection": "Upgrade",
            "Upgrade": "SPDY/3.1",
            "X-Stream-Protocol-Version": protocol,
        },
    )
    writer = await response.prepare(request)
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:
        send_headers()
    try:
        ready = await session.wait_for_streams(_wanted_streams(request), timeout=10)
    except TimeoutError:
        ready = False
    if ready:
        await _run(session, ctx, record, protocol)
    if request.transport is not None:
        request.transport.close()
    return response


async def _run(
    session: Session, ctx: commands.Context, record: cluster_mod.ExecRecord, protocol: str
) -> None:
    argv = record.argv

    async def emit(channel: int, data: bytes) -> None:
        session.send_data("stdout" if channel == commands.STDOUT else "stderr", data)

    task = asyncio.ensure_future(commands.run(ctx, argv, emit))
    closed = asyncio.ensure_future(session.closed.wait())
    done, _ = await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return
    closed.cancel()
    rc = record.exit_code = task.result()
    session.send_data("stdout", b"", fin=True)
    session.send_data("stderr", b"", fin=True)
    status = commands.status_for(argv, rc)
    if protocol == "v4.channel.k8s.io":
        session.send_data("error", json.dumps(status).encode(), fin=True)
    else:
        session.send_data("error", status.get("message", "").encode(), fin=True)
    session.goaway()
