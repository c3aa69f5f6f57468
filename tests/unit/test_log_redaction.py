from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from remediator.app import logs


@pytest.fixture
def redactor():
    redactor = logs.Redactor()
    redactor.add(["exact-secret-value-123", "short"])
    return redactor


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET /x?token=abc&b=1 HTTP/1.1", "GET /x?token=[redacted]&b=1 HTTP/1.1"),
        ("GET /?access_token=a%20b HTTP/1.1", "GET /?access_token=[redacted] HTTP/1.1"),
        ("password=hunter2 user=bob", "password=[redacted] user=bob"),
        ("Authorization: Bearer abc.def", "Authorization: [redacted]"),
        ("b'Authorization: Bearer tok\\x01'\n   ^", "b'Authorization: [redacted]\n   ^"),
        ("sent Bearer abc.def to it", "sent Bearer [redacted] to it"),
        ("Basic b2xpdmlhOnNlY3JldC10b2tlbg==", "Basic [redacted]"),
        ("Cookie: remediator_session=abc; x=1", "Cookie: [redacted]"),
        ("Set-Cookie: remediator_session=abc; Path=/", "Set-Cookie: [redacted]"),
        ("{'csrf_token': 'abc', 'n': 1}", "{'csrf_token': '[redacted]', 'n': 1}"),
        ('{"X-Session": "abc"}', '{"X-Session": "[redacted]"}'),
        ("postgresql+asyncpg://u:pw@db/r", "postgresql+asyncpg://u:[redacted]@db/r"),
        ("the exact-secret-value-123!", "the [redacted]!"),
    ],
)
def test_credentials_are_redacted(redactor, text, expected):
    assert redactor(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "authentication failed: reason=unknown_token address=10.0.0.1 name=olivia path=/x",
        "Basic checks of node gpu-node-01 passed",
        "short values like short are not registered",
        "http://127.0.0.1:8080/api/v1/runs?limit=5",
        "GET /api/v1/runs?cursor=12 HTTP/1.1",
    ],
)
def test_ordinary_lines_are_left_alone(redactor, text):
    assert redactor(text) == text


def test_json_lines_redact_extra_fields_and_exceptions():
    formatter = logs.JsonFormatter()
    try:
        raise ValueError("Authorization: Bearer in-the-exception")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "f", 1, "m %s", ("token=abc",), None)
        record.exc_info = sys.exc_info()
    record.first_request_line = "GET /?session=abc HTTP/1.1"
    line = json.loads(formatter.format(record))
    assert line["message"] == "m token=[redacted]"
    assert line["first_request_line"] == "GET /?session=[redacted] HTTP/1.1"
    assert "in-the-exception" not in line["exception"]


def test_every_handler_sees_the_redacted_record():
    factory = logging.getLogRecordFactory()
    logs.install_redaction()
    logs.install_redaction()  # idempotent
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # a handler without any filter of ours
    logger = logging.getLogger("remediator.test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("header %s", {"Authorization": "Bearer abc"})
        logger.warning("query %s", "/?csrf=abc")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logging.setLogRecordFactory(factory)
    assert stream.getvalue() == "header {'Authorization': [redacted]\nquery /?csrf=[redacted]\n"
