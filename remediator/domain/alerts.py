"""Alertmanager webhook payload (version 4) and the alert *episode* identity.

Alertmanager delivers at least once: every repeat interval, on group changes, after failed
attempts and from each replica of an HA pair. One alert episode is identified by
``(fingerprint, startsAt)``: the fingerprint hashes the label set, ``startsAt`` tells one firing
of that label set from the next. Everything else in a delivery may change between repeats.

Models accept what Alertmanager 0.25 sends and tolerate unknown extra fields, so a newer
Alertmanager does not get its deliveries rejected.

Storage limits (``check_limits``): intake refuses, with 400 naming the field, every value that
could never be stored, before anything is written. A value the database refuses would otherwise
come back on every try: as 503 at intake (Alertmanager retries forever) or, once stored, as a
failing engine pass for every alert. The limits are the column sizes of
``adapters/db/tables.py`` (alertname ``String(256)``, ``runs.node`` ``String(253)``,
``runs.gpu`` ``String(128)``) and, for the JSON columns that have none, bounds no real alert
comes near. A node or GPU is derived by playbooks from labels (``matching.first_label``), so
every label of ``DEFAULT_NODE_LABELS`` (``instance`` with its port stripped) is held to the node
limit and every label of ``DEFAULT_GPU_LABELS`` to the GPU limit, whichever a playbook reads.

Only length is checked, not node-name syntax: a short ``node`` label that is not a valid
Kubernetes node name (an IPv6 ``instance``, an upper-case ``Hostname``) is stored and poisons
nothing; actions validate node names before any Kubernetes call, and the same label may matter
to no playbook at all. Refusing the whole group for it would hold back its valid alerts too.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any

import pydantic

from remediator.domain import matching

ZERO_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)

_RFC3339 = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<frac>\d+))?(?P<tz>[Zz]|[+-]\d{2}:\d{2})$"
)


# Parsed timestamp texts: Alertmanager re-sends the same ``startsAt`` / ``endsAt`` texts over
# and over, so most deliveries parse nothing. Bounded (emptied when full); errors not kept.
_STAMPS: dict[str, dt.datetime] = {}
_MAX_STAMPS = 8192


def parse_timestamp(value: object) -> dt.datetime:
    """Parse RFC 3339 leniently: any number of fraction digits (truncated to microseconds)."""
    if type(value) is not str:
        return _parse_timestamp(value)
    stamp = _STAMPS.get(value)
    if stamp is None:
        stamp = _parse_timestamp(value)  # a text that is no timestamp raises every time
        if len(_STAMPS) >= _MAX_STAMPS:
            _STAMPS.clear()
        _STAMPS[value] = stamp
    return stamp


def _parse_timestamp(value: object) -> dt.datetime:
    if isinstance(value, dt.datetime):
        stamp = value
    elif isinstance(value, str):
        found = _RFC3339.fullmatch(value)
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
    try:
        return stamp.astimezone(dt.UTC)
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is past the year 9999 in UTC
        raise ValueError("timestamp out of range in UTC") from None


Timestamp = Annotated[dt.datetime, pydantic.BeforeValidator(parse_timestamp)]


def json_integer(value: object) -> object:
    """A JSON integer as it is (5 or 5.0); a string or a boolean is refused."""
    if isinstance(value, str | bool):  # pydantic would read "5" and true as integers
        raise ValueError("must be a JSON integer")
    return value


# A JSON integer (5 or 5.0), not a string or a boolean.
JsonInteger = Annotated[int, pydantic.BeforeValidator(json_integer)]
LabelSet = dict[Annotated[str, pydantic.StringConstraints(max_length=1024)], str]

# Column sizes of adapters/db/tables.py: a longer value could never be stored.
MAX_ALERTNAME = 256  # alert_episodes.alertname
MAX_NODE = 253  # runs.node, disruptions.node; also the longest Kubernetes node name
MAX_GPU = 128  # runs.gpu
# Labels and annotations are stored as JSON, which has no size: bounds no real alert comes near.
MAX_ENTRIES = 128  # labels, or annotations, of one alert
MAX_NAME = 256  # a label or annotation name
MAX_LABEL_VALUE = 4096
MAX_ANNOTATION_VALUE = 32768
MAX_ALERTS = 10_000  # of one delivery

# No label value of at most this length exceeds its limit, whatever the label's name (the node
# taken from ``instance`` is never longer than the label).
_SHORT_LABEL = min(MAX_ALERTNAME, MAX_NODE, MAX_GPU, MAX_LABEL_VALUE)


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
    alerts: list[Alert] = pydantic.Field(max_length=MAX_ALERTS)
    group_labels: LabelSet = pydantic.Field(default_factory=dict, alias="groupLabels")
    common_labels: LabelSet = pydantic.Field(default_factory=dict, alias="commonLabels")
    common_annotations: LabelSet = pydantic.Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = pydantic.Field(default="", alias="externalURL", max_length=8192)
    group_key: str = pydantic.Field(default="", alias="groupKey", max_length=8192)
    truncated_alerts: JsonInteger = pydantic.Field(default=0, alias="truncatedAlerts", ge=0)

    @pydantic.field_validator("version")
    @classmethod
    def _version_4(cls, version: str) -> str:
        if version != "4":
            raise ValueError(f"unsupported webhook version {version!r}; expected '4'")
        return version


def _within(longest: int) -> Any:
    """Labels or annotations within bounds under which no entry can exceed a limit, whatever
    its name: at most ``MAX_ENTRIES`` entries, names of at most ``MAX_NAME`` characters, values
    of at most ``longest``."""
    name = Annotated[str, pydantic.StringConstraints(max_length=MAX_NAME)]
    value = Annotated[str, pydantic.StringConstraints(max_length=longest)]
    return Annotated[dict[name, value], pydantic.Field(max_length=MAX_ENTRIES)]


class _StorableAlert(Alert):
    if not typing.TYPE_CHECKING:  # (the same dicts to a type checker)
        labels: _within(_SHORT_LABEL)
        annotations: _within(MAX_ANNOTATION_VALUE) = pydantic.Field(default_factory=dict)


class _StorablePayload(WebhookPayload):
    """A payload whose every alert was held by pydantic's core, as it parsed them, within the
    bounds that prove it storable (``_within``): ``check_limits`` has nothing to walk. Proving
    it in the parser took a few constraints in compiled code, where walking every entry of
    every alert in Python was 5 % of a delivery's instructions."""

    alerts: list[_StorableAlert] = pydantic.Field(max_length=MAX_ALERTS)  # type: ignore[assignment]


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
    try:
        payload: WebhookPayload = _StorablePayload.model_validate_json(body)
    except pydantic.ValidationError:  # invalid (raised again here), or beyond those bounds
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


_MAX_PROBLEMS = 50
# (name, value) -> (the length that is stored, the longest that can be, what the value is)
_Size = Callable[[str, str], tuple[int, int, str]]


def check_limits(payload: WebhookPayload) -> list[dict[str, str]]:
    """Every value that could never be stored, in the shape of ``validation_fields``
    (``[{"field": "alerts.0.labels.node", "message": ...}]``); empty when all of it fits.
    A payload ``parse_payload`` proved storable as it parsed it has nothing to walk."""
    if type(payload) is _StorablePayload:
        return []
    return _limit_problems(payload)


def _limit_problems(payload: WebhookPayload) -> list[dict[str, str]]:
    problems: list[dict[str, str]] = []
    for index, alert in enumerate(payload.alerts):
        where = f"alerts.{index}"
        problems += _entry_problems(alert.labels, f"{where}.labels", size=_label_size)
        problems += _entry_problems(
            alert.annotations, f"{where}.annotations", size=_annotation_size
        )
        if len(problems) >= _MAX_PROBLEMS:
            break
    return problems[:_MAX_PROBLEMS]


def _entry_problems(
    entries: Mapping[str, str], where: str, *, size: _Size
) -> Iterator[dict[str, str]]:
    if len(entries) > MAX_ENTRIES:
        yield _problem(where, f"{len(entries)} entries; at most {MAX_ENTRIES} are stored")
    for name, value in entries.items():
        if len(name) > MAX_NAME:
            field = f"{where}.{name[:40]}…"
            yield _problem(field, f"name of {len(name)} characters; at most {MAX_NAME}")
            continue
        length, limit, what = size(name, value)
        if length > limit:
            yield _problem(f"{where}.{name}", f"{what} of {length} characters; at most {limit}")


def _label_size(name: str, value: str) -> tuple[int, int, str]:
    if name == "alertname":
        return len(value), MAX_ALERTNAME, "alertname"
    if name == "instance":  # playbooks take the node from it with the port stripped
        return len(matching.strip_port(value)), MAX_NODE, "node name (instance without port)"
    if name in matching.DEFAULT_NODE_LABELS:
        return len(value), MAX_NODE, "node name"
    if name in matching.DEFAULT_GPU_LABELS:
        return len(value), MAX_GPU, "GPU id"
    return len(value), MAX_LABEL_VALUE, "label value"


def _annotation_size(name: str, value: str) -> tuple[int, int, str]:
    return len(value), MAX_ANNOTATION_VALUE, "annotation"


def _problem(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}


def describe(alert: Alert) -> dict[str, Any]:
    return {
        "alertname": alert.alertname,
        "fingerprint": alert.fingerprint,
        "status": alert.status.value,
        "startsAt": alert.starts_at.isoformat(),
    }
