"""Secrets never reach a log line, from remediator's loggers or aiohttp's own: requests with
tokens, cookies and CSRF values in headers and query strings, and malformed Authorization
headers, go through the real app on a real server with logging configured as ``serve`` does,
and both the configured handler's output and pytest's capture are searched for them."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging

import pytest
import yaml

from remediator.app import logs

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

TOKEN = "op-secret-token-7f3a9c21d4e5"  # a valid operator token, from the tokens file
WRONG = "guess-secret-4b8d2e61aa90"  # a wrong token: still never logged
COOKIE = "cookie-secret-9e1d7c3b5a20"
CSRF = "csrf-secret-2c6f0a8e4d17"
SESSION_SECRET = "session-signing-secret-5d3b1f70"


@pytest.fixture
def configured_logs(caplog):
    """Logging as ``serve`` sets it up (JSON to a stream, aiohttp's access log on), with
    pytest's capture handler behind it; the previous set-up is restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogRecordFactory())
    access = logging.getLogger("aiohttp.access")
    saved_access = access.level
    logs.configure("INFO", "json")
    stream = io.StringIO()
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    root.addHandler(caplog.handler)
    access.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.handlers[:], level, factory = saved
        root.setLevel(level)
        logging.setLogRecordFactory(factory)
        access.setLevel(saved_access)
        logs.redact.clear()


def _tokens(tmp_path):
    path = tmp_path / "tokens.yaml"
    entries = [
        {"name": "olivia", "token": TOKEN, "roles": ["operator"]},
        {"name": "alertmanager", "token": "ingest-token-0123456789", "roles": ["ingest"]},
    ]
    path.write_text(yaml.safe_dump(entries))
    return path


async def _raw(h, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(h.client.host, h.client.port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def _request(h, *headers: bytes, target: bytes = b"/api/v1/runs") -> bytes:
    host = f"Host: {h.client.host}:{h.client.port}".encode()
    lines = [b"GET " + target + b" HTTP/1.1", host, *headers, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


SECRETS = (TOKEN, WRONG, COOKIE, CSRF, SESSION_SECRET)


def _leaks(text: str) -> list[str]:
    encoded = {s: base64.b64encode(f"olivia:{s}".encode()).decode() for s in SECRETS}
    return [s for s in SECRETS if s in text or encoded[s] in text]


@SQLITE_ONLY
async def test_credentials_in_requests_never_reach_any_log_line(
    make_harness, tmp_path, caplog, configured_logs
):
    h = await make_harness(tokens=_tokens(tmp_path), session_secret=SESSION_SECRET)
    basic = base64.b64encode(f"olivia:{TOKEN}".encode()).decode()
    wrong_basic = base64.b64encode(f"olivia:{WRONG}".encode()).decode()
    cases = [
        ({"Authorization": f"Bearer {TOKEN}"}, f"/api/v1/runs?token={TOKEN}&x=1"),
        ({"Authorization": f"Basic {basic}"}, f"/api/v1/runs?access_token={TOKEN}"),
        ({"Authorization": f"Bearer {WRONG}"}, f"/api/v1/runs?password={WRONG}"),
        ({"Authorization": f"Basic {wrong_basic}"}, "/api/v1/runs"),
        ({"Authorization": f"Bearer{TOKEN}"}, "/api/v1/runs"),  # no space: malformed
        ({"Authorization": f"Token {TOKEN}"}, "/api/v1/runs"),  # unknown scheme
        ({"Cookie": f"remediator_session={COOKIE}"}, f"/runs?csrf_token={CSRF}&session={COOKIE}"),
    ]
    for headers, path in cases:
        response = await h.client.get(path, headers=headers)
        assert response.status < 500, (path, response.status)
    # Malformed at the HTTP level: aiohttp's parser refuses these before the app sees them
    # and logs the raw header bytes.
    for header in (
        b"Authorization: Bearer " + TOKEN.encode() + b"\x01",
        b"Authorization: Basic " + basic.encode() + b"\x7f",
        b"Cookie: remediator_session=" + COOKIE.encode() + b"\x00",
    ):
        answer = await _raw(h, _request(h, header))
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    await _raw(h, _request(h, target=b"/api/v1/runs?token=" + TOKEN.encode() + b"\x01"))

    output = configured_logs.getvalue()
    lines = [json.loads(line) for line in output.splitlines()]
    assert _leaks(output) == []
    assert _leaks(caplog.text) == []
    for record in caplog.records:
        shown = [record.getMessage(), record.exc_text or "", record.stack_info or ""]
        assert _leaks("\n".join(shown)) == [], record.name
    # The server logged the malformed requests (with the exception) and the access log still
    # logs every request, its query string redacted.
    assert any(line["logger"] == "aiohttp.server" and "exception" in line for line in lines)
    access = [line["message"] for line in lines if line["logger"] == "aiohttp.access"]
    assert len(access) >= len(cases)
    assert any("GET /api/v1/runs?token=[redacted]&x=1 HTTP/1.1" in line for line in access)
    assert any(
        r.name == "aiohttp.access" and "/api/v1/runs?password=[redacted]" in r.getMessage()
        for r in caplog.records
    )


@SQLITE_ONLY
async def test_the_tokens_file_and_session_secret_values_are_redacted_wherever_they_appear(
    make_harness, tmp_path, caplog, configured_logs
):
    await make_harness(tokens=_tokens(tmp_path), session_secret=SESSION_SECRET)
    logger = logging.getLogger("remediator.test")
    logger.warning("a library printed %s and %s", TOKEN, SESSION_SECRET)
    logger.warning("in extra", extra={"detail": {"seen": [TOKEN]}})
    try:
        raise RuntimeError(f"bad value {TOKEN!r}")
    except RuntimeError:
        logger.exception("failed")
    output = configured_logs.getvalue()
    assert _leaks(output) == []
    assert _leaks(caplog.text) == []
    assert "a library printed [redacted] and [redacted]" in output
    assert '"detail": {"seen": ["[redacted]"]}' in output
    assert "RuntimeError: bad value '[redacted]'" in output
