"""A seeded generator of hostile HTTP requests for remediator's front door.

Everything comes from one ``random.Random(seed)``: the same seed and the same ``Credentials``
give the same requests in the same order, whatever the server answers. Kinds of requests:
mutated real Alertmanager bodies, the operators' JSON bodies and forms (with and without a
session and CSRF token, URL-encoded and multipart), reads with odd ids and query strings,
compressed, chunked, oversize and lying bodies, and plain garbage.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import random
import struct
import urllib.parse
import zlib
from collections.abc import Iterator
from typing import Any

from tests.support.rawhttp import Wire

JSON_TYPE = b"application/json"
FORM_TYPE = b"application/x-www-form-urlencoded"
METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD", b"OPTIONS", b"TRACE", b"get"]
METHODS += [b"PROPFIND", b"FOO", b"CONNECT"]
ODD_IDS = ["0", "1", "2", "3", "5", "-1", "+1", "01", " 1", "1.0", "1e3", "0x1f", "1_000"]
ODD_IDS += [
    "\u0663",
    "\uff11\uff12",
    "\u00b2",
    "\u07c1",
    str(2**63 - 1),
    str(2**63),
    str(2**64),
    "-" + str(2**63),
]
ODD_IDS += ["9" * 40, "9" * 5000, "a" * 5000, "%00", "1%00", "%FF", "%C0%AF", "%E2%80%8B"]
ODD_IDS += ["..", "%2e%2e", "%2F", "%252F", "null", "[]", "💥", "%F0%9F%92%A5", "%5C", "1;2"]
TIMES = ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+00:01", "0001-01-01T00:00:00-14:00"]
TIMES += ["9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59-00:01", "9999-12-31T23:59:59+14:00"]
TIMES += ["10000-01-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-11-30T24:00:00Z", "-0001-01-01"]
TIMES += ["2026-11-30T00:00:00+25:00", "2026-11-30T00:00:00.1234567891Z", "2026-W48-1", "now"]
TIMES += ["1970-01-01", "2026-11-30T00:02:27.47Z", "2026-11-30", "", " ", "%00", "2026-11-30T00"]
TIMES += ["0001-01-02T00:00:00Z", "9999-12-30T00:00:00Z", "2026-11-30T00:00:00\u0660Z"]
ARTIFACTS = ["a", "../etc/passwd", "%00", "x/" * 600, "..%2F..%2Fetc", "%2Fetc%2Fpasswd"]
LIMITS = ["", "0", "1", "50", "500", "501", "-1", "1e2", "\u0663", "9" * 25, "abc", "%00", "2.5"]
FILTERS = ["status", "alertname", "fingerprint", "playbook", "node", "kind", "episode", "gpu"]
FILTERS += ["action", "outcome", "principal", "run", "since", "until", "format", "cursor"]
FILTERS += ["limit", "bogus", "", "limit[]", "%00", "é"]
STRINGS = ["", " ", "firing", "gpu-node-03", "GPUXidError79", "é", "\u202e", "\x00", "\x7f"]
STRINGS += ["\ufeff", "a" * 300, "💥" * 50, "' OR 1=1 --", "%", "_", "\\", "\n", "{{ 7*7 }}"]
STRINGS += ["<script>alert(1)</script>", "..\\..", "\udc80"]
ENCODINGS = [b"gzip", b"deflate", b"br", b"GZIP", b"x-gzip", b"identity, gzip", b"gzip, gzip"]
ENCODINGS += [b"compress", b"zstd", b"identity", b"", b"\xff", b"gzip;q=1"]
CONTENT_TYPES = [JSON_TYPE, b"application/json; charset=utf-8", b"application/JSON", FORM_TYPE]
CONTENT_TYPES += [b"multipart/form-data", b"multipart/form-data; boundary=x", b"text/plain"]
CONTENT_TYPES += [b"application/json; charset=latin-1", b"", b";", b"application/", b"\xff/\xfe"]
CONTENT_TYPES += [b"application/merge-patch+json", b"*/*", b"application/json; boundary=\x00"]


def _random_text(seed: int, size: int) -> str:
    """Printable ASCII mixed with any code point (surrogates and NUL included)."""
    rng = random.Random(seed)
    return "".join(
        chr(rng.randrange(32, 127) if rng.random() < 0.5 else rng.randrange(0x110000))
        for _ in range(size)
    )


_TEXT = _random_text(0, 20_000)


@dataclasses.dataclass(frozen=True)
class Session:
    cookie: str
    csrf: str


@dataclasses.dataclass(frozen=True)
class Credentials:
    """What the generator may use: tokens by name (with roles), signed-in sessions by role
    (``spare`` ones are the ones it may sign out), sign-in nonces, runbook names."""

    tokens: dict[str, tuple[str, list[str]]]
    sessions: dict[str, Session]
    spare: dict[str, Session]
    nonces: list[str]
    runbooks: list[str]
    bodies: list[dict[str, Any]]
    max_body: int
    small_body: int = 64 * 1024
    sources: int = 48


def gzip_bomb(size: int, *, container: str = "gzip") -> bytes:
    """``size`` zero bytes (a multiple of 1 MiB) compressed as one gzip or zlib (``deflate``)
    stream, about ``size / 1000`` bytes. Made without compressing ``size`` bytes: after a full
    flush the compressor starts afresh, so every 1 MiB of zeros compresses to the same block,
    repeated; only the checksum runs over the whole length (of one zeroed buffer, again)."""
    chunk = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = size >> 20
    deflated = block * count + compressor.flush()
    if container == "gzip":
        crc = 0
        for _ in range(count):
            crc = zlib.crc32(chunk, crc)
        head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
        return head + deflated + struct.pack("<II", crc, size & 0xFFFFFFFF)
    adler = 1
    for _ in range(count):
        adler = zlib.adler32(chunk, adler)
    return b"\x78\xda" + deflated + struct.pack(">I", adler)


class Generator:
    def __init__(self, seed: int, creds: Credentials) -> None:
        self.rng = random.Random(seed)
        self.creds = creds
        self.kinds = [
            (self.intake, 28),
            (self.json_endpoint, 16),
            (self.form, 14),
            (self.read, 22),
            (self.wrapped, 10),
            (self.chaos, 10),
        ]

    def __iter__(self) -> Iterator[tuple[Wire, str]]:
        kinds, weights = zip(*self.kinds, strict=True)
        while True:
            kind = self.rng.choices(kinds, weights)[0]
            wire = kind()
            yield wire, f"127.0.{self.rng.randrange(2)}.{self.rng.randrange(self.creds.sources)}"

    # -- pieces --------------------------------------------------------------------------

    def pick(self, items: list[Any]) -> Any:
        return items[self.rng.randrange(len(items))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def token_of(self, *roles: str) -> str:
        names = [n for n, (_, rs) in self.creds.tokens.items() if set(rs) & set(roles)]
        return self.creds.tokens[self.pick(names)][0]

    def auth(self, *roles: str) -> list[tuple[bytes, bytes]]:
        """Credentials: mostly a valid token of one of ``roles``, else anything."""
        r = self.rng.random()
        if r < 0.55:
            return [(b"Authorization", b"Bearer " + self.token_of(*roles).encode())]
        if r < 0.65:
            name = self.pick([*self.creds.tokens, "", "nobody", "é\x00"])
            raw = f"{name}:{self.token_of(*roles)}".encode()
            return [(b"Authorization", b"Basic " + base64.b64encode(raw))]
        if r < 0.72:
            role = self.pick(list(self.creds.sessions))
            return [(b"Cookie", b"remediator_session=" + self.creds.sessions[role].cookie.encode())]
        return self.bad_auth()

    def bad_auth(self) -> list[tuple[bytes, bytes]]:
        value = self.pick(
            [
                b"Bearer "
                + self.rng.randbytes(self.rng.randrange(1, 40))
                .replace(b"\r", b"")
                .replace(b"\n", b""),
                b"Bearer \xff\xfe\x80",
                b"Basic \xc3\xa4\xff==",
                b"Basic " + base64.b64encode(b"no-colon"),
                b"Basic " + base64.b64encode(b"\xff\xfe:\x80"),
                b"Basic ====",
                b"Basic",
                b"Bearer",
                b"Bearer ",
                b"Digest username=x",
                b"bearer " + self.token_of("admin").encode() + b"x",
                b"Bearer " + b"A" * self.rng.choice([100, 4000]),
                b"Basic " + base64.b64encode(f"{self.rng.random()}:{self.rng.random()}".encode()),
                self.rng.randbytes(20).replace(b"\r", b"").replace(b"\n", b""),
            ]
        )
        return [] if self.chance(0.15) else [(b"Authorization", value)]

    def odd_id(self) -> str:
        if self.chance(0.5):
            return str(self.rng.choice([1, 2, 3, 4, 5, 6, 8, 13, 100]))
        return self.pick(ODD_IDS)

    def text(self) -> str:
        if self.chance(0.4):
            return self.pick(STRINGS)
        size = self.rng.choice([1, 5, 20, 200])
        start = self.rng.randrange(len(_TEXT) - size)
        return _TEXT[start : start + size]

    def json_value(self, depth: int = 0) -> Any:
        r = self.rng.randrange(12 if depth < 3 else 8)
        scalars: list[Any] = [
            None,
            self.chance(0.5),
            self.rng.choice([0, -1, 2**63, 2**64, -(2**63) - 1, 10**30]),
            self.rng.choice([1e308, -0.0, 5e-324, 0.5]),
            self.text(),
            self.pick(TIMES),
            "x" * self.rng.choice([4001, 70_000]),
            self.rng.choice([True, 1, "1", "true"]),
        ]
        if r < 8:
            return scalars[r]
        if r < 10:
            return [self.json_value(depth + 1) for _ in range(self.rng.randrange(4))]
        return {self.text(): self.json_value(depth + 1) for _ in range(self.rng.randrange(4))}

    def nested(self, value: Any) -> Any:
        for _ in range(self.rng.randrange(20, 45)):
            value = [value] if self.chance(0.5) else {"a": value}
        return value

    def walk(self, value: Any) -> tuple[Any, ...]:
        """A random path into ``value``: down from the top, stopping on the way at random."""
        path: tuple[Any, ...] = ()
        while isinstance(value, dict | list) and value:
            key = (
                self.pick(list(value))
                if isinstance(value, dict)
                else self.rng.randrange(len(value))
            )
            path, value = (*path, key), value[key]
            if self.chance(0.35):
                break
        return path

    def mutate(self, body: Any, times: int) -> Any:
        body = json.loads(json.dumps(body))
        for _ in range(times):
            path = self.walk(body)
            if not path:
                return self.json_value()
            parent = body
            for part in path[:-1]:
                parent = parent[part]
            op = self.rng.randrange(6)
            if op == 0:
                del parent[path[-1]]
            elif op == 1:
                parent[path[-1]] = self.json_value()
            elif op == 2:
                parent[path[-1]] = self.nested(parent[path[-1]])
            elif op == 3:
                parent[path[-1]] = self.pick(TIMES)
            elif op == 4 and isinstance(parent, dict):
                parent[self.text()] = self.json_value()
            else:
                parent[path[-1]] = self.text()
        return body

    def crowd(self, body: dict[str, Any]) -> dict[str, Any]:
        """The payload with a few to hundreds of alerts like its first (on as many nodes)."""
        alert = body["alerts"][0]
        count = self.rng.choice([5, 20, 21, 400])
        crowd = [
            alert | {"fingerprint": f"{n:016x}", "labels": alert["labels"] | {"node": f"n-{n}"}}
            for n in range(count)
        ]
        return body | {"alerts": crowd}

    def dump(self, value: Any) -> bytes:
        try:
            text = json.dumps(value, ensure_ascii=self.chance(0.5))
            data = text.encode("utf-8")
        except (UnicodeEncodeError, ValueError):
            data = json.dumps(value).encode()
        if self.chance(0.1):
            data = self.garble(data)
        return data

    def garble(self, data: bytes) -> bytes:
        data = bytearray(data)
        for _ in range(self.rng.randrange(1, 6)):
            op = self.rng.randrange(4)
            at = self.rng.randrange(len(data) + 1)
            if op == 0:
                del data[at:]
            elif op == 1 and data:
                data[min(at, len(data) - 1)] = self.rng.randrange(256)
            elif op == 2:
                data[at:at] = self.rng.randbytes(self.rng.randrange(1, 8))
            else:
                data[at:at] = self.pick([b'"a":1,"a":2', b"\\ud800", b"NaN", b"1e999", b"\x00"])
        return bytes(data)

    def extra_headers(self) -> list[tuple[bytes, bytes]]:
        headers = []
        if self.chance(0.08):
            origin = self.pick([b"http://127.0.0.1", b"http://evil.example", b"null", b"\xff"])
            headers.append((b"Origin", origin))
        if self.chance(0.04):
            headers.append((b"Sec-Fetch-Site", self.pick([b"cross-site", b"same-origin"])))
        if self.chance(0.03):
            headers.append((b"Expect", b"100-continue"))
        if self.chance(0.03):
            headers.append((b"X-Junk", b"v" * self.rng.choice([100, 9000])))
        if self.chance(0.03):
            headers.append(
                (b"Cookie", self.rng.randbytes(30).replace(b"\r", b"").replace(b"\n", b""))
            )
        return headers

    def query(self, names: list[str]) -> str:
        if self.chance(0.3):
            return ""
        pairs = []
        for _ in range(self.rng.randrange(1, 5)):
            name = self.pick(names if names and self.chance(0.8) else FILTERS)
            if name in ("since", "until"):
                value = self.pick(TIMES)
            elif name in ("limit", "cursor", "run", "episode"):
                value = self.pick(LIMITS) if self.chance(0.5) else self.odd_id()
            else:
                value = self.text()
            pairs.append(f"{_quote(name)}={_quote(value)}")
        if self.chance(0.05):
            pairs.append(self.pick(["&&", "=", "a=%", "a=%zz", "a" * 5000, "%FF=%FE"]))
        return "?" + "&".join(pairs)

    def request(
        self, method: bytes, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Wire:
        target = (
            path.encode("utf-8", "surrogatepass")
            if path.isascii() or self.chance(0.5)
            else urllib.parse.quote(path, safe="/?=&%", errors="surrogatepass").encode()
        )
        return Wire(method, target, tuple(headers + self.extra_headers()), body)

    # -- kinds of requests ---------------------------------------------------------------

    def content_type(self, usual: bytes) -> list[tuple[bytes, bytes]]:
        if self.chance(0.85):
            return [(b"Content-Type", usual)]
        return [] if self.chance(0.2) else [(b"Content-Type", self.pick(CONTENT_TYPES))]

    def intake(self) -> Wire:
        body = self.pick(self.creds.bodies)
        if self.chance(0.05):
            body = self.crowd(body)
        if self.chance(0.85):
            body = self.mutate(body, self.rng.randrange(1, 4))
        headers = self.auth("ingest", "admin") + self.content_type(JSON_TYPE)
        return self.request(b"POST", "/api/v1/alerts", headers, self.dump(body))

    def json_endpoint(self) -> Wire:
        run, step = self.odd_id(), self.odd_id()
        book = self.pick([*self.creds.runbooks, "gpu-xid-error", "nope", "a" * 300, "%00", "é"])
        trigger = {"node": "gpu-node-03", "params": {"reason": "fixed", "node": "gpu-node-03"}}
        path, body = self.pick(
            [
                (f"/api/v1/runs/{run}/steps/{step}/approve", {"comment": "ok"}),
                (f"/api/v1/runs/{run}/steps/{step}/reject", {"comment": "no"}),
                ("/api/v1/breaker/reset", {"comment": "reset"}),
                (f"/api/v1/runbooks/{book}/runs", trigger),
                (f"/api/v1/runbooks/{book}/runs", {"selector": "gpu=true", "dryRun": True}),
                (f"/api/v1/runbooks/{book}/runs", {"dryRun": True, "params": {}}),
                ("/api/v1/plan", self.pick(self.creds.bodies)),
                ("/api/v1/plan", self.crowd(self.pick(self.creds.bodies))),
            ]
        )
        if self.chance(0.8):
            body = self.mutate(body, self.rng.randrange(0, 3))
        headers = self.auth("operator", "admin", "auditor") + self.content_type(JSON_TYPE)
        return self.request(b"POST", path, headers, self.dump(body))

    def form_fields(self, session: Session | None) -> list[tuple[str, str]]:
        csrf = session.csrf if session is not None and self.chance(0.7) else self.text()
        fields = [("csrf", csrf)] if self.chance(0.85) else []
        for name in self.rng.sample(
            ["comment", "node", "param.reason", "param.retries", "token", "name", "param.node"],
            self.rng.randrange(4),
        ):
            fields.append(
                (
                    name,
                    self.text()
                    if self.chance(0.5)
                    else self.pick(["ok", "gpu-node-03", "1", "true", "x" * 70_000]),
                )
            )
        if self.chance(0.03):
            fields += [(f"f{i}", "v") for i in range(self.rng.choice([150, 250]))]
        self.rng.shuffle(fields)
        return fields

    def multipart(self, fields: list[tuple[str, str]]) -> tuple[bytes, bytes]:
        boundary = self.pick([b"x", b"----fuzz", b"", b"\xff", b"a" * 100])
        parts = (
            b"".join(
                b"--"
                + boundary
                + b'\r\nContent-Disposition: form-data; name="'
                + name.encode("utf-8", "surrogatepass")
                + b'"\r\n\r\n'
                + value.encode("utf-8", "surrogatepass")
                + b"\r\n"
                for name, value in fields
            )
            + b"--"
            + boundary
            + b"--\r\n"
        )
        kind = b"multipart/form-data" + (b"; boundary=" + boundary if self.chance(0.6) else b"")
        return kind, parts

    def form(self) -> Wire:
        run, step = self.odd_id(), self.odd_id()
        book = self.pick([*self.creds.runbooks, "gpu-xid-error", "nope", "%00", "💥"])
        path = self.pick(
            [
                "/runbooks/login",
                "/runbooks/logout",
                f"/runbooks/{book}/trigger",
                f"/runbooks/runs/{run}/steps/{step}/approve",
                f"/runbooks/runs/{run}/steps/{step}/reject",
            ]
        )
        role = self.pick(list(self.creds.sessions))
        pool = self.creds.spare if path.endswith("logout") else self.creds.sessions
        session = pool[role] if self.chance(0.75) else None
        headers: list[tuple[bytes, bytes]] = []
        cookies = []
        if session is not None:
            cookies.append(f"remediator_session={session.cookie}")
        fields = self.form_fields(session)
        if path == "/runbooks/login":
            nonce = self.pick(self.creds.nonces) if self.chance(0.8) else self.text()
            cookies.append(f"remediator_login={nonce}")
            fields = [
                ("csrf", nonce if self.chance(0.8) else self.text()),
                (
                    "token",
                    self.token_of("operator", "auditor", "admin", "ingest")
                    if self.chance(0.5)
                    else self.text(),
                ),
                ("name", self.pick(["", *self.creds.tokens, self.text()])),
            ]
        if cookies and self.chance(0.9):
            headers.append((b"Cookie", "; ".join(cookies).encode("utf-8", "surrogatepass")))
        if self.chance(0.15):
            headers += self.auth("operator", "admin")
        if self.chance(0.2):
            kind, body = self.multipart(fields)
            headers.append((b"Content-Type", kind))
        else:
            body = urllib.parse.urlencode(fields, errors="surrogatepass").encode()
            if self.chance(0.1):
                body += self.pick([b"&%FF=%FE", b"&a=%", b"&\xff=1", b"&&&", b"&csrf"])
            headers += self.content_type(FORM_TYPE)
        return self.request(b"POST", path, headers, body)

    def read(self) -> Wire:
        run = self.odd_id()
        path, names = self.pick(
            [
                ("/api/v1/alerts", ["status", "alertname", "fingerprint", "limit", "cursor"]),
                (
                    "/api/v1/runs",
                    ["status", "playbook", "node", "kind", "episode", "limit", "cursor"],
                ),
                (f"/api/v1/runs/{run}", []),
                (f"/api/v1/runs/{run}/plan", []),
                ("/api/v1/approvals", []),
                ("/api/v1/runbooks", []),
                ("/api/v1/breaker", []),
                ("/api/v1/audit/events", [*FILTERS[:16], "limit", "cursor"]),
                ("/api/v1/audit/runs", [*FILTERS[:16], "limit", "cursor"]),
                ("/api/v1/audit/export", [*FILTERS[:16], "format"]),
                ("/api/v1/audit/verify", []),
                (f"/api/v1/deliveries/{run}", []),
                (f"/api/v1/artifacts/{self.pick([*ARTIFACTS, run])}", []),
                ("/runbooks", []),
                ("/runbooks/login", []),
                (f"/runbooks/runs/{run}", []),
                ("/healthz", []),
                ("/readyz", []),
                ("/metrics", []),
                ("/api/v1/openapi.json", []),
            ]
        )
        method = b"GET" if self.chance(0.85) else self.pick([b"HEAD", b"OPTIONS", b"DELETE"])
        headers = self.auth("auditor", "operator", "admin", "ingest")
        return self.request(method, path + self.query(names), headers, b"")

    def wrapped(self) -> Wire:
        """A body compressed, chunked, oversize or with a length that lies."""
        wire = self.pick([self.intake, self.json_endpoint, self.form])()
        headers = list(wire.headers)
        body = wire.body
        r = self.rng.randrange(5)
        if r == 0:
            encoding = self.pick(ENCODINGS)
            body = (
                gzip.compress(body)
                if b"gzip" in encoding.lower()
                else zlib.compress(body)
                if self.chance(0.5)
                else body
            )
            headers.append((b"Content-Encoding", encoding))
        elif r == 1:
            limit = (
                self.creds.max_body if wire.target == b"/api/v1/alerts" else self.creds.small_body
            )
            body = body + b" " * (limit + 1 - len(body) + self.rng.randrange(1000))
        elif r == 2:
            return dataclasses.replace(wire, headers=tuple(headers), chunked=True)
        elif r == 3:
            headers.append(
                (
                    b"Content-Length",
                    self.pick([b"-1", b"abc", b"1, 2", b"99999999999999999999", b" 5"]),
                )
            )
            return dataclasses.replace(wire, headers=tuple(headers), length=-1)
        else:  # declares more than it sends: the server waits body_read_timeout, then 408
            return dataclasses.replace(wire, length=len(body) + self.rng.randrange(1, 100))
        return dataclasses.replace(wire, headers=tuple(headers), body=body)

    def chaos(self) -> Wire:
        method = self.pick(METHODS)
        r = self.rng.randrange(4)
        if r == 0:
            path = "/" + "/".join(
                self.pick(
                    [
                        "api",
                        "v1",
                        "runs",
                        "runbooks",
                        "alerts",
                        self.odd_id(),
                        "steps",
                        "approve",
                        "..",
                        "",
                    ]
                )
                for _ in range(self.rng.randrange(1, 7))
            )
        elif r == 1:
            path = self.pick(
                [
                    "*",
                    "",
                    "http://127.0.0.1/healthz",
                    "//",
                    "/%",
                    "/%zz",
                    "/\x7f",
                    "/api/v1/alerts#x",
                    "/?" + "a" * 9000,
                ]
            )
        elif r == 2:
            path = self.read().target.decode("utf-8", "surrogatepass")
        else:
            path = "/" + self.rng.randbytes(self.rng.randrange(1, 30)).decode("latin-1").replace(
                " ", ""
            ).replace("\r", "").replace("\n", "")
        headers = (
            self.auth("admin", "operator", "auditor", "ingest")
            if self.chance(0.6)
            else self.bad_auth()
        )
        headers += self.content_type(self.pick(CONTENT_TYPES))
        body = self.rng.randbytes(self.rng.randrange(0, 3000)) if self.chance(0.5) else b""
        wire = self.request(method, path, headers, body)
        if self.chance(0.05):
            wire = dataclasses.replace(
                wire, host=self.pick([None, b"evil.example", b"\xff", b"[::1]"])
            )
        return wire


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="%", errors="surrogatepass")
