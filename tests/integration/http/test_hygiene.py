"""HTTP hygiene: whatever a client sends, the answer is a 4xx in the server's error shape, never
a 500, a hang or database text; bodies are read only after authentication, within a size
limit and a time limit, and never inflated; cross-site and DNS-rebinding requests are refused.

Tests whose input reaches the database run on SQLite and Postgres; the rest only on SQLite.
Each test tries its cases on one app and names every case that went wrong."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import json
import re
import time
import zlib

import pytest
from aiohttp import http_parser

from tests.integration.operators.conftest import GATED, MANUAL, TOKENS, bearer, write_tokens
from tests.support.alerts import alert_body

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
HUGE_INT = b"9" * 5000
BEYOND_63_BITS = str(2**63)
LARGEST_ID = str(2**63 - 1)


# -- a raw HTTP/1.1 client: bytes in, bytes out -----------------------------------------


async def _response(reader, timeout=5.0):
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    return status, headers, body


def _head(h, method, path, headers, *, host=""):
    lines = [f"{method} {path} HTTP/1.1".encode()]
    if host is not None:
        lines.append(f"Host: {host or h.client.host}:{h.client.port}".encode())
    lines += [name.encode() + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _raw(h, method, path, headers=(), body=b"", *, timeout=5.0, host="", hangs_up=False):
    """Send one request exactly as given (header values are bytes) and read the answer;
    ``host=None`` sends no Host header; with ``hangs_up`` the server must then close the
    connection within a second, whatever the client still means to send."""
    headers = list(headers)
    if body and not any(name == "Content-Length" for name, _ in headers):
        headers.append(("Content-Length", str(len(body)).encode()))
    reader, writer = await asyncio.open_connection(h.client.host, h.client.port)
    try:
        writer.write(_head(h, method, path, headers, host=host) + body)
        await writer.drain()
        answer = await _response(reader, timeout)
        if hangs_up:
            assert await asyncio.wait_for(reader.read(), 1.0) == b"", "still connected"
        return answer
    finally:
        writer.close()


def _error(body):
    error = json.loads(body)["error"]
    assert set(error) <= {"code", "message", "fields"}
    assert isinstance(error["code"], str)
    assert isinstance(error["message"], str)
    return error


async def _status_and_error(response):
    text = await response.text()
    try:
        return response.status, _error(text)
    except (ValueError, KeyError, AssertionError):
        return response.status, {"code": None, "message": text[:200]}


async def _signed_in_form_csrf(h, name="olivia"):
    """Sign ``name`` in through the login form; the CSRF token of the runbooks page."""
    page = await (await h.client.get("/runbooks/login")).text()
    nonce = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    signed = await h.client.post(
        "/runbooks/login",
        data={"token": TOKENS[name][0], "csrf": nonce},
        allow_redirects=False,
    )
    assert signed.status == 303
    page = await (await h.client.get("/runbooks")).text()
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


# -- 1. client input that cannot be decoded or parsed is a 4xx, never a 500 ---------------


@SQLITE_ONLY
async def test_credentials_that_are_not_utf8_are_401_not_500(make_harness, tmp_path):
    # Fifteen bad credentials from one address: lift the sign-in throttle.
    h = await make_harness(GATED, tokens=write_tokens(tmp_path), auth_failure_limit=1000)
    problems = []
    for credentials in (b"Bearer \xff\xfe\x80", b"Basic \xc3\xa4\xff==", b"Basic \xc3\xa4"):
        for method, path in [
            ("GET", "/api/v1/runs"),
            ("POST", "/api/v1/alerts"),
            ("POST", "/api/v1/breaker/reset"),
            ("GET", "/api/v1/audit/events"),
            ("POST", "/runbooks/logout"),
        ]:
            headers = [("Authorization", credentials), ("Content-Type", b"application/json")]
            status, answer, body = await _raw(h, method, path, headers, b"{}")
            if status != 401 or _error(body)["code"] != "unauthorized":
                problems.append(f"{credentials!r} {method} {path}: {status} {body[:80]!r}")
    status, answer, _ = await _raw(h, "GET", "/runbooks", [("Authorization", b"Bearer \xff")])
    assert (status, answer["location"]) == (303, "/runbooks/login")
    assert problems == []


@SQLITE_ONLY
async def test_multipart_posts_to_forms_are_415_even_without_a_boundary(make_harness, tmp_path):
    h = await make_harness(GATED, MANUAL, tokens=write_tokens(tmp_path))
    assert (await h.client.get("/runbooks/login")).status == 200  # the sign-in nonce cookie
    response = await h.client.post(
        "/runbooks/login", data=b"token=x", headers={"Content-Type": "multipart/form-data"}
    )
    status, error = await _status_and_error(response)
    assert (status, error["code"]) == (415, "unsupported_media_type")
    csrf = await _signed_in_form_csrf(h)
    for content_type in ("multipart/form-data", "multipart/form-data; boundary=x"):
        response = await h.client.post(
            "/runbooks/return-to-service/trigger",
            data=f"--x\r\nContent-Disposition: form-data; name=csrf\r\n\r\n{csrf}\r\n--x--\r\n",
            headers={"Content-Type": content_type},
            allow_redirects=False,
        )
        status, error = await _status_and_error(response)
        assert (status, error["code"]) == (415, "unsupported_media_type"), content_type
    assert await h.runs() == []


@SQLITE_ONLY
async def test_form_fields_that_are_not_utf8_or_not_ascii_numbers_are_400(make_harness, tmp_path):
    h = await make_harness(GATED, MANUAL, tokens=write_tokens(tmp_path))
    csrf = await _signed_in_form_csrf(h)
    response = await h.client.post(
        "/runbooks/return-to-service/trigger",
        data=f"csrf={csrf}&node=gpu-node-01&param.reason=%ff%fe",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        allow_redirects=False,
    )
    assert (await _status_and_error(response))[0] == 400
    typed = await h.client.post(
        "/runbooks/return-to-service/trigger",
        data={"csrf": csrf, "node": "gpu-node-01", "param.reason": "x", "param.retries": "²"},
        allow_redirects=False,
    )
    assert typed.status == 400, await typed.text()
    assert await h.runs() == []


async def test_ids_must_be_ascii_decimal_within_63_bits(make_harness):
    """In a path an id that is none is not found; in a query it is a 400, never a database
    error (SQLite overflows, Postgres names the int64 argument)."""
    h = await make_harness(GATED)
    assert (await h.post(alert_body())).status == 200
    await h.settle()
    problems = []
    for path in (
        "/api/v1/runs/²",
        "/api/v1/runs/¹²/plan",
        "/api/v1/deliveries/²",
        "/runbooks/runs/²",
        f"/api/v1/runs/{BEYOND_63_BITS}",
        f"/api/v1/runs/{BEYOND_63_BITS}/plan",
        f"/api/v1/deliveries/{'9' * 30}",
        "/api/v1/runs/-1",
        f"/api/v1/runs/{LARGEST_ID}",
    ):
        status, error = await _status_and_error(await h.client.get(path, allow_redirects=False))
        if (status, error["code"]) != (404, "not_found"):
            problems.append(f"{path}: {status} {error}")
    for path, query in [
        ("/api/v1/runs", {"episode": "²"}),
        ("/api/v1/runs", {"episode": "9" * 30}),
        ("/api/v1/runs", {"episode": BEYOND_63_BITS}),
        ("/api/v1/runs", {"cursor": BEYOND_63_BITS}),
        ("/api/v1/runs", {"cursor": "١٢"}),
        ("/api/v1/alerts", {"cursor": "9" * 25}),
        ("/api/v1/alerts", {"limit": "⁵"}),
        ("/api/v1/alerts", {"limit": "501"}),
        ("/api/v1/audit/events", {"run": "²"}),
        ("/api/v1/audit/events", {"run": BEYOND_63_BITS}),
        ("/api/v1/audit/events", {"cursor": BEYOND_63_BITS}),
        ("/api/v1/audit/runs", {"cursor": BEYOND_63_BITS}),
    ]:
        status, error = await _status_and_error(await h.client.get(path, params=query))
        leaked = "database" in error["message"].lower() or "int64" in json.dumps(error)
        if status != 400 or leaked:
            problems.append(f"{path} {query}: {status} {error}")
    for query in ({"cursor": LARGEST_ID}, {"episode": LARGEST_ID}):
        response = await h.client.get("/api/v1/runs", params=query)
        if response.status != 200:
            problems.append(f"/api/v1/runs {query}: {response.status}")
    assert problems == []


async def test_alert_times_that_overflow_in_utc_are_400_so_alertmanager_stops(make_harness):
    """A 500 would be retried by Alertmanager forever."""
    h = await make_harness(GATED)
    problems = []
    for field in ("startsAt", "endsAt"):
        for stamp in ("9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59.999-01:00"):
            raw = json.loads(alert_body(status="resolved"))
            raw["alerts"][0][field] = stamp
            status, error = await _status_and_error(await h.post(json.dumps(raw).encode()))
            named = [f["field"] for f in error.get("fields", [])]
            if (status, error["code"]) != (
                400,
                "invalid_payload",
            ) or f"alerts.0.{field}" not in named:
                problems.append(f"{field}={stamp}: {status} {error}")
    assert problems == []
    assert (await h.post(alert_body(node="gpu-node-07"))).status == 200


async def test_since_and_until_near_the_datetime_limits_are_400_even_on_the_export(make_harness):
    """The export once answered 200 with an empty body: its query failed after the headers."""
    h = await make_harness(GATED)
    assert (await h.post(alert_body())).status == 200
    await h.settle()
    problems = []
    for path in ("/api/v1/audit/export", "/api/v1/audit/events", "/api/v1/audit/runs"):
        for name, value in [
            ("since", "0001-01-01T00:00:00Z"),
            ("since", "0001-01-01T00:02:00+00:00"),
            ("since", "0001-01-01T00:00:00+23:59"),
            ("until", "9999-12-31T23:59:59Z"),
            ("until", "9999-12-31T23:59:59-23:59"),
            ("until", "not a time"),
        ]:
            status, error = await _status_and_error(await h.client.get(path, params={name: value}))
            fields = [f["field"] for f in error.get("fields", [])]
            if status != 400 or fields != [name]:
                problems.append(f"{path} {name}={value}: {status} {error}")
    assert problems == []
    ok = await h.client.get("/api/v1/audit/export", params={"since": "2000-01-01T00:00:00+02:00"})
    assert ok.status == 200
    assert len((await ok.text()).splitlines()) > 1


@SQLITE_ONLY
async def test_artifact_paths_too_long_or_with_nul_are_404(make_harness, tmp_path):
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "report.txt").write_text("kept")
    h = await make_harness(GATED, artifact_dir=tmp_path / "artifacts")
    problems = []
    for path in ("a" * 5000, "a" * 300, "x%00y", "%00", "report.txt%00", "a/" * 3000 + "b", "%ff"):
        status, error = await _status_and_error(await h.client.get("/api/v1/artifacts/" + path))
        if (status, error["code"]) != (404, "not_found"):
            problems.append(f"{path[:20]}: {status} {error}")
    assert problems == []
    assert await (await h.client.get("/api/v1/artifacts/report.txt")).text() == "kept"


JSON_BODIES = {
    "deep": b"[" * 20_000 + b"]" * 20_000,
    "deep-object": b'{"comment": "x", "a": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001,
    "huge-int": b'{"comment": ' + HUGE_INT + b"}",
    "huge-int-extra": b'{"comment": "x", "n": ' + HUGE_INT + b"}",
    "beyond-64-bits": b'{"comment": "x", "n": 18446744073709551616}',
    "infinite": b'{"comment": "x", "n": 1e400}',
    "nan": b'{"comment": "x", "n": NaN}',
    "not-utf8": b'{"comment": "\xff"}',
    "nested-200": b'{"comment": "x", "a": ' + b"[" * 200 + b"]" * 200 + b"}",
}


@SQLITE_ONLY
async def test_deep_or_huge_json_bodies_are_400(make_harness):
    h = await make_harness(GATED, MANUAL)
    problems = []
    for path in (
        "/api/v1/runs/1/steps/1/approve",
        "/api/v1/runs/1/steps/1/reject",
        "/api/v1/breaker/reset",
        "/api/v1/runbooks/return-to-service/runs",
    ):
        for name, body in JSON_BODIES.items():
            response = await h.client.post(
                path, data=body, headers={"Content-Type": "application/json"}
            )
            status, error = await _status_and_error(response)
            if status != 400 or error["code"] != "invalid":
                problems.append(f"{path} {name}: {status} {error}")
    huge = b'{"node": "gpu-node-01", "params": {"reason": "x", "retries": ' + HUGE_INT + b"}}"
    response = await h.client.post(
        "/api/v1/runbooks/return-to-service/runs",
        data=huge,
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 400
    assert problems == []
    assert await h.runs() == []
    breaker = await (await h.client.get("/api/v1/breaker")).json()
    assert breaker.get("resetBy") is None


@SQLITE_ONLY
async def test_a_database_outage_answers_503_without_the_databases_words(make_harness, monkeypatch):
    from remediator.domain import errors

    h = await make_harness(GATED)

    async def unavailable(**_):
        raise errors.StoreUnavailable("database unavailable: (asyncpg) password for user x")

    monkeypatch.setattr(h.components.queries, "runs", unavailable)
    response = await h.client.get("/api/v1/runs")
    status, error = await _status_and_error(response)
    assert (status, error["code"]) == (503, "unavailable")
    assert "asyncpg" not in error["message"]
    assert response.headers["Retry-After"]


# -- 2. bodies: read after authentication, bounded, never inflated --------------------------


@SQLITE_ONLY
async def test_strangers_are_refused_before_their_body_is_read(make_harness, tmp_path):
    """The body is announced but never sent: only an answer that reads nothing comes back."""
    h = await make_harness(GATED, MANUAL, tokens=write_tokens(tmp_path))
    problems = []
    for path, expected in [
        ("/runbooks/logout", 401),
        ("/runbooks/runs/1/steps/1/approve", 401),
        ("/runbooks/return-to-service/trigger", 401),
        ("/runbooks/login", 403),  # no sign-in nonce cookie
        ("/api/v1/breaker/reset", 401),
        ("/api/v1/runs/1/steps/1/approve", 401),
        ("/api/v1/runbooks/return-to-service/runs", 401),
        ("/api/v1/plan", 401),
        ("/api/v1/alerts", 401),
    ]:
        headers = [
            ("Content-Type", b"application/x-www-form-urlencoded"),
            ("Content-Length", b"1000000"),
        ]
        started = time.monotonic()
        try:
            status, answer, _ = await _raw(h, "POST", path, headers, timeout=3.0)
        except TimeoutError:
            problems.append(f"{path}: no answer while the body is missing")
            continue
        if (status, answer.get("connection")) != (expected, "close"):
            problems.append(f"{path}: {status} {answer}")
        if time.monotonic() - started > 2.0:
            problems.append(f"{path}: slow")
    assert problems == []


@SQLITE_ONLY
async def test_compressed_bodies_are_refused_unread(make_harness, monkeypatch):
    """A 1 MB gzip body inflating to 1 GiB once blocked the event loop for seconds. Not even
    aiohttp's parser may start inflating one while its bytes arrive."""
    inflaters = []
    made = http_parser.DeflateBuffer.__init__

    def counted(self, *args, **kwargs):
        inflaters.append(args[1:2])
        made(self, *args, **kwargs)

    monkeypatch.setattr(http_parser.DeflateBuffer, "__init__", counted)
    h = await make_harness(GATED)
    await h.client.get("/runbooks/login")  # the nonce cookie, for the sign-in form
    cookies = "; ".join(f"{c.key}={c.value}" for c in h.client.session.cookie_jar).encode()
    bombs = {
        b"gzip": gzip.compress(b"\0" * (8 * 1024 * 1024)),
        b"deflate": zlib.compress(b"\0" * (8 * 1024 * 1024)),
        b"identity, gzip": gzip.compress(b"\0" * (8 * 1024 * 1024)),
    }
    problems = []
    for path in ("/runbooks/login", "/runbooks/logout", "/api/v1/alerts", "/api/v1/breaker/reset"):
        for encoding, bomb in bombs.items():
            headers = [
                ("Content-Type", b"application/json"),
                ("Content-Encoding", encoding),
                ("Content-Length", str(len(bomb) * 100).encode()),  # most of it never comes
                ("Cookie", cookies),
            ]
            try:
                status, answer, body = await _raw(
                    h, "POST", path, headers, bomb, timeout=3.0, hangs_up=True
                )
            except (TimeoutError, AssertionError) as e:
                problems.append(f"{path} {encoding!r}: no answer or no hang-up ({e!r})")
                continue
            code = _error(body)["code"] if status == 415 else body[:80]
            if (status, code, answer.get("connection")) != (415, "unsupported_media_type", "close"):
                problems.append(f"{path} {encoding!r}: {status} {code!r} {answer}")
    assert problems == []
    assert inflaters == []
    assert (await h.client.get("/healthz")).status == 200


@SQLITE_ONLY
async def test_bodies_above_their_endpoints_limit_are_413(make_harness, tmp_path):
    h = await make_harness(GATED, MANUAL, tokens=write_tokens(tmp_path))
    csrf = await _signed_in_form_csrf(h)
    big = {"csrf": csrf, "node": "gpu-node-01", "param.reason": "x" * 100_000}
    response = await h.client.post(
        "/runbooks/return-to-service/trigger", data=big, allow_redirects=False
    )
    assert (await _status_and_error(response))[1]["code"] == "too_large"
    assert response.status == 413
    response = await h.client.post(
        "/api/v1/breaker/reset", json={"comment": "x" * 200_000}, headers=bearer("olivia")
    )
    assert (response.status, (await _status_and_error(response))[1]["code"]) == (413, "too_large")
    assert await h.runs() == []


@SQLITE_ONLY
async def test_a_body_that_stops_arriving_is_408_after_body_read_timeout(make_harness):
    h = await make_harness(GATED, body_read_timeout=0.3)
    problems = []
    for path in ("/api/v1/alerts", "/api/v1/breaker/reset", "/api/v1/plan"):
        reader, writer = await asyncio.open_connection(h.client.host, h.client.port)
        try:
            headers = [("Content-Type", b"application/json"), ("Content-Length", b"5000")]
            writer.write(_head(h, "POST", path, headers) + b'{"version": "4", ')
            await writer.drain()
            started = time.monotonic()
            status, answer, body = await _response(reader, timeout=5.0)
            took = time.monotonic() - started
            code = _error(body)["code"] if body else None
            if (status, code, answer.get("connection")) != (408, "timeout", "close"):
                problems.append(f"{path}: {status} {code} {answer}")
            if not 0.25 < took < 3.0:
                problems.append(f"{path}: answered after {took:.2f} s")
            if await asyncio.wait_for(reader.read(), 3.0) != b"":
                problems.append(f"{path}: the connection stayed open")
        finally:
            writer.close()
    assert problems == []


# -- 3. CSRF: JSON needs application/json; cross-site state changes are refused -------------


@SQLITE_ONLY
async def test_json_endpoints_refuse_other_content_types_with_415(make_harness):
    """``text/plain`` and form bodies need no CORS preflight: a page could send them."""
    h = await make_harness(GATED, MANUAL)
    problems = []
    for path in (
        "/api/v1/breaker/reset",
        "/api/v1/runs/1/steps/1/approve",
        "/api/v1/runbooks/return-to-service/runs",
        "/api/v1/plan",
        "/api/v1/alerts",
    ):
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": content_type} if content_type else {}
            response = await h.client.post(path, data=b'{"comment": "reset"}', headers=headers)
            status, error = await _status_and_error(response)
            if (status, error["code"]) != (415, "unsupported_media_type"):
                problems.append(f"{path} {content_type}: {status} {error}")
    assert problems == []
    assert (await (await h.client.get("/api/v1/breaker")).json()).get("resetBy") is None


@SQLITE_ONLY
async def test_cross_site_state_changes_are_403(make_harness):
    h = await make_harness(GATED, MANUAL)
    problems = []
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": f"http://{h.client.host}"},  # another port is another origin
        {"Origin": f"http://{h.client.host}:{h.client.port}.evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
    ):
        for path, body in [
            ("/api/v1/breaker/reset", {"comment": "reset"}),
            ("/api/v1/runbooks/return-to-service/runs", {"node": "gpu-node-01", "params": {}}),
            ("/api/v1/alerts", None),
            ("/runbooks/logout", None),
        ]:
            if body is None:
                response = await h.client.post(
                    path, data=alert_body(), headers={**headers, "Content-Type": "application/json"}
                )
            else:
                response = await h.client.post(path, json=body, headers=headers)
            status, error = await _status_and_error(response)
            if (status, error["code"]) != (403, "cross_origin"):
                problems.append(f"{path} {headers}: {status} {error}")
    assert problems == []
    assert await h.runs() == []


@SQLITE_ONLY
async def test_same_origin_posts_and_the_origin_less_webhook_still_work(make_harness):
    h = await make_harness(GATED, MANUAL)
    own = f"http://{h.client.host}:{h.client.port}"
    response = await h.client.post(
        "/api/v1/breaker/reset",
        json={"comment": "reset"},
        headers={"Origin": own, "Sec-Fetch-Site": "same-origin"},
    )
    assert response.status == 200, await response.text()
    assert (await h.post(alert_body())).status == 200
    read = await h.client.get("/api/v1/runs", headers={"Origin": "http://evil.example"})
    assert read.status == 200  # reads change nothing (and CORS keeps them unreadable)


@SQLITE_ONLY
async def test_a_configured_external_url_is_the_servers_own_origin(make_harness, tmp_path):
    h = await make_harness(
        GATED, tokens=write_tokens(tmp_path), external_url="https://remediator.example.com/ui/"
    )
    reset = {"comment": "reset"}
    behind_proxy = {"Origin": "https://remediator.example.com", **bearer("olivia")}
    response = await h.client.post("/api/v1/breaker/reset", json=reset, headers=behind_proxy)
    assert response.status == 200, await response.text()
    other = {"Origin": "https://evil.example.com", **bearer("olivia")}
    response = await h.client.post("/api/v1/breaker/reset", json=reset, headers=other)
    assert response.status == 403


# -- 4. DNS rebinding: without a tokens file only loopback names ---------------------------


@SQLITE_ONLY
async def test_open_mode_serves_only_loopback_host_names(make_harness):
    h = await make_harness(GATED)
    problems = []
    for host in ("evil.example", "evil.example:8080", "10.0.0.1", "127.0.0.1.nip.io", "[::2]"):
        for path in ("/api/v1/runs", "/healthz", "/runbooks"):
            status, _, body = await _raw(h, "GET", path, [("Host", host.encode())], host=None)
            code = _error(body)["code"] if status == 421 else body[:60]
            if (status, code) != (421, "misdirected_request"):
                problems.append(f"{host} {path}: {status} {code!r}")
    for host in ("localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "LOCALHOST"):
        status, _, body = await _raw(h, "GET", "/api/v1/runs", [("Host", host.encode())], host=None)
        if status != 200:
            problems.append(f"{host}: {status} {body[:60]!r}")
    assert problems == []


@SQLITE_ONLY
async def test_with_a_tokens_file_any_host_name_is_served(make_harness, tmp_path):
    h = await make_harness(GATED, tokens=write_tokens(tmp_path))
    headers = {"Host": "remediator.example.com", **bearer("olivia")}
    response = await h.client.get("/api/v1/runs", headers=headers)
    assert response.status == 200, await response.text()


# -- 5. the server names itself without versions ------------------------------------------


@SQLITE_ONLY
async def test_the_server_header_names_no_versions(make_harness):
    h = await make_harness(GATED)
    for path in ("/healthz", "/nowhere", "/api/v1/audit/export", "/runbooks"):
        response = await h.client.get(path)
        assert response.headers["Server"] == "remediator", path


# -- 6. the catch-all: a parse error nobody expected is still the client's 400 ------------


@pytest.mark.parametrize(
    "raised",
    [
        lambda: int("²x"),
        lambda: b"\xff".decode("utf-8"),
        lambda: json.loads("[" * 100_000),
        lambda: (
            datetime.datetime.max.replace(tzinfo=datetime.UTC).astimezone(
                datetime.timezone(datetime.timedelta(hours=-1))
            )
            + datetime.timedelta(days=1)
        ),
    ],
    ids=["int", "utf8", "recursion", "overflow"],
)
async def test_an_unexpected_decode_error_of_client_input_is_400_in_the_error_shape(
    aiohttp_client, raised
):
    from aiohttp import web

    from remediator.adapters.http import errors as http_errors
    from remediator.adapters.http import hygiene

    async def handler(request):
        raised()
        return web.json_response({})

    app = web.Application(middlewares=[hygiene.middleware, http_errors.error_middleware])
    app.router.add_get("/parse", handler)
    client = await aiohttp_client(app)
    response = await client.get("/parse")
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "bad_request"
