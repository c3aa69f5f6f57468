from __future__ import annotations

import datetime as dt
import json

import pydantic
import pytest

from remediator.domain import alerts
from tests.conftest import am_fixture_paths


@pytest.mark.parametrize("path", am_fixture_paths(), ids=lambda p: p.stem)
def test_every_real_alertmanager_body_parses(path):
    payload = alerts.parse_payload(path.read_bytes())
    raw = json.loads(path.read_bytes())
    assert payload.receiver == raw["receiver"]
    assert len(payload.alerts) == len(raw["alerts"])
    for alert, raw_alert in zip(payload.alerts, raw["alerts"], strict=True):
        assert alert.fingerprint == raw_alert["fingerprint"]
        assert alert.labels == raw_alert["labels"]
        assert alert.status.value == raw_alert["status"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T00:01:55Z", dt.datetime(2026, 11, 30, 0, 1, 55, tzinfo=dt.UTC)),
        ("2026-11-30T00:01:55.4Z", dt.datetime(2026, 11, 30, 0, 1, 55, 400000, tzinfo=dt.UTC)),
        ("2026-11-30T00:01:55.47Z", dt.datetime(2026, 11, 30, 0, 1, 55, 470000, tzinfo=dt.UTC)),
        (
            "2026-11-30T00:01:55.123456789Z",
            dt.datetime(2026, 11, 30, 0, 1, 55, 123456, tzinfo=dt.UTC),
        ),
        (
            "2026-11-30T01:01:55.5+01:00",
            dt.datetime(2026, 11, 30, 0, 1, 55, 500000, tzinfo=dt.UTC),
        ),
        ("0001-01-01T00:00:00Z", alerts.ZERO_TIME),
    ],
)
def test_timestamps_parse_with_any_number_of_fraction_digits(text, expected):
    assert alerts.parse_timestamp(text) == expected


@pytest.mark.parametrize(
    "text",
    ["yesterday", "2026-11-30", "2026-11-30T00:01:55", "", 12, "2026-11-30T00:01:55Z\n"],
)
def test_timestamps_without_zone_or_shape_are_refused(text):
    with pytest.raises(ValueError, match=r"timestamp|RFC 3339"):
        alerts.parse_timestamp(text)


def _body(**changes):
    raw = json.loads(am_fixture_paths()[0].read_bytes())
    raw.update(changes)
    return json.dumps(raw).encode()


def test_unknown_fields_are_tolerated():
    raw = json.loads(am_fixture_paths()[0].read_bytes())
    raw["somethingNew"] = {"nested": [1, 2]}
    raw["alerts"][0]["silencedBy"] = ["x"]
    payload = alerts.parse_payload(json.dumps(raw).encode())
    assert payload.alerts[0].fingerprint == raw["alerts"][0]["fingerprint"]


def test_firing_alert_keeps_zero_ends_at():
    payload = alerts.parse_payload(am_fixture_paths()[0].read_bytes())
    firing = [a for a in payload.alerts if a.status is alerts.AlertStatus.FIRING]
    assert firing
    assert all(a.ends_at == alerts.ZERO_TIME for a in firing)


def test_wrong_version_is_a_field_error():
    with pytest.raises(pydantic.ValidationError) as info:
        alerts.parse_payload(_body(version="3"))
    fields = alerts.validation_fields(info.value)
    assert fields[0]["field"] == "version"


def test_alert_without_alertname_is_refused_with_its_location():
    raw = json.loads(am_fixture_paths()[0].read_bytes())
    del raw["alerts"][0]["labels"]["alertname"]
    with pytest.raises(pydantic.ValidationError) as info:
        alerts.parse_payload(json.dumps(raw).encode())
    assert alerts.validation_fields(info.value)[0]["field"] == "alerts.0.labels"


def test_label_values_must_be_strings():
    raw = json.loads(am_fixture_paths()[0].read_bytes())
    raw["alerts"][0]["labels"]["gpu"] = 1
    with pytest.raises(pydantic.ValidationError):
        alerts.parse_payload(json.dumps(raw).encode())


def test_deep_nesting_is_a_validation_error_not_a_crash():
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(pydantic.ValidationError):
        alerts.parse_payload(deep)


_STAMP_TEXTS = [
    "2026-11-30T00:01:55Z",
    "2026-11-30T00:01:55.123456789+02:00",
    "2026-11-30 00:01:55z",
    "0001-01-01T00:00:00Z",
    "0001-01-01T05:00:00+05:00",
    "9999-12-31T23:59:59-23:59",
    "2026-02-30T00:01:55Z",
    "2026-11-30T00:01:55",
    "yesterday",
    "",
]


def _outcome(parse, value):
    try:
        return parse(value)
    except ValueError as e:
        return ("error", str(e))


@pytest.mark.parametrize("text", _STAMP_TEXTS)
def test_remembered_timestamps_are_what_parsing_gives(text):
    """Timestamp texts are parsed once and remembered; what comes back, value or error, is
    the same on every call as what parsing the text gives."""
    alerts._STAMPS.clear()
    expected = _outcome(alerts._parse_timestamp, text)
    assert [_outcome(alerts.parse_timestamp, text) for _ in range(3)] == [expected] * 3
    assert (text in alerts._STAMPS) == (not isinstance(expected, tuple))
    if not isinstance(expected, tuple):
        assert expected.tzinfo is dt.UTC


def test_remembered_timestamps_are_bounded():
    alerts._STAMPS.clear()
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for second in range(alerts._MAX_STAMPS + 10):
        stamp = start + dt.timedelta(seconds=second)
        text = stamp.isoformat().replace("+00:00", "Z")
        assert alerts.parse_timestamp(text) == stamp
        assert len(alerts._STAMPS) <= alerts._MAX_STAMPS
