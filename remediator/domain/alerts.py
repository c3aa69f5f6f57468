"""Alertmanager webhook payload (version 4) and the alert *episode* identity.

Alertmanager delivers at least once: every repeat interval, on group changes, after failed
attempts and from each replica of an HA pair. One alert episode is identified by
``(fingerprint, startsAt)``: the fingerprint hashes the label set, ``startsAt`` tells one firing
of that label set from the next. Everything else in a delivery may change between repeats.

Models accept what Alertmanager 0.25 sends and tolerate unknown extra fields, so a newer
Alertmanager does not get its deliveries rejected.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from typing import Annotated, Any

import pydantic

ZERO_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)

_RFC3339 = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<frac>\d+))?(?P<tz>[Zz]|[+-]\d{2}:\d{2})$"
)


def parse_timestamp(value: object) -> dt.datetime:
    """Parse RFC 3339 leniently: any number of fraction digits (truncated to microseconds)."""
    if isinstance(value, dt.datetime):
        stamp = value
    elif isinstance(value, str):
        found = _RFC3339.match(value)
        if not found:
            raise ValueError("not an RFC 3339 timestamp")
        frac = (found["frac"] or "")[:6].ljust(6, "0")
        tz = found["tz"].upper().replace("Z", "+00:00")
        try:
            stamp = dt.datetime.fromisoformat(f"{found['date']}T{found['time']}.{frac}{tz}")
        except ValueError as e:
            raise ValueError(f"invalid timestamp: {e}") from None
    else:
        raise ValueError("timestamp must be a string")
    if stamp.tzinfo is None:
        raise ValueError("timestamp needs a timezone")
    if stamp.year == 1:
        return ZERO_TIME
    return stamp.astimezone(dt.UTC)


Timestamp = Annotated[dt.datetime, pydantic.BeforeValidator(parse_timestamp)]
LabelSet = dict[Annotated[str, pydantic.StringConstraints(max_length=1024)], str]


class AlertStatus(enum.StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class _Tolerant(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore", frozen=True)


class Alert(_Tolerant):
    status: AlertStatus
    labels: LabelSet
    annotations: LabelSet = pydantic.Field(default_factory=dict)
    starts_at: Timestamp = pydantic.Field(alias="startsAt")
    ends_at: Timestamp = pydantic.Field(default=ZERO_TIME, alias="endsAt")
    generator_url: str = pydantic.Field(default="", alias="generatorURL", max_length=8192)
    fingerprint: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")

    @pydantic.field_validator("labels")
    @classmethod
    def _needs_alertname(cls, labels: dict[str, str]) -> dict[str, str]:
        if not labels.get("alertname"):
            raise ValueError("labels must include a non-empty alertname")
        return labels


class WebhookPayload(_Tolerant):
    """The body Alertmanager POSTs to a webhook receiver (``version: "4"``)."""

    version: str = "4"
    receiver: str = pydantic.Field(default="", max_length=1024)
    status: AlertStatus
    alerts: list[Alert] = pydantic.Field(max_length=10_000)
    group_labels: LabelSet = pydantic.Field(default_factory=dict, alias="groupLabels")
    common_labels: LabelSet = pydantic.Field(default_factory=dict, alias="commonLabels")
    common_annotations: LabelSet = pydantic.Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = pydantic.Field(default="", alias="externalURL", max_length=8192)
    group_key: str = pydantic.Field(default="", alias="groupKey", max_length=8192)
    truncated_alerts: int = pydantic.Field(default=0, alias="truncatedAlerts", ge=0)

    @pydantic.field_validator("version")
    @classmethod
    def _version_4(cls, version: str) -> str:
        if version != "4":
            raise ValueError(f"unsupported webhook version {version!r}; expected '4'")
        return version


def validation_fields(error: pydantic.ValidationError) -> list[dict[str, str]]:
    """Field-level errors as ``[{"field": "alerts.0.status", "message": ...}]``."""
    fields: list[dict[str, str]] = []
    for item in error.errors(include_url=False, include_input=False)[:50]:
        loc = ".".join(str(part) for part in item["loc"]) or "(body)"
        fields.append({"field": loc, "message": str(item["msg"])})
    return fields


def parse_payload(body: bytes) -> WebhookPayload:
    """Validate a raw body; raises ``pydantic.ValidationError`` (with a recursion limit).

    NUL characters are refused: no label value carries one in practice, and Postgres cannot
    store them in text, so such a payload could never be stored on every backend.
    """
    payload = WebhookPayload.model_validate_json(body)
    if b"\\u0000" in body:
        found = _find_nul(payload.model_dump(by_alias=True))
        if found is not None:
            raise pydantic.ValidationError.from_exception_data(
                "WebhookPayload",
                [
                    {
                        "type": "value_error",
                        "loc": found,
                        "input": None,
                        "ctx": {"error": ValueError("NUL characters are not allowed")},
                    }
                ],
            )
    return payload


def _find_nul(value: Any, loc: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    if isinstance(value, str):
        return loc if "\x00" in value else None
    items: Any = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, child in items:
        if isinstance(key, str) and "\x00" in key:
            return (*loc, key)
        found = _find_nul(child, (*loc, key))
        if found is not None:
            return found
    return None


def describe(alert: Alert) -> dict[str, Any]:
    return {
        "alertname": alert.alertname,
        "fingerprint": alert.fingerprint,
        "status": alert.status.value,
        "startsAt": alert.starts_at.isoformat(),
    }
