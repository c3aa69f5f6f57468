"""``alerts.check_limits``: every value intake stores fits its column, or the field is named."""

from __future__ import annotations

import json

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediator.domain import alerts
from tests.support.alerts import alert_body


def _problems(**changes):
    return alerts.check_limits(alerts.parse_payload(alert_body(**changes)))


def _labels(labels):
    raw = json.loads(alert_body())
    raw["alerts"][0]["labels"] |= labels
    return alerts.check_limits(alerts.parse_payload(json.dumps(raw).encode()))


def _fields(problems):
    return [problem["field"] for problem in problems]


def test_a_real_alertmanager_alert_fits():
    assert _problems() == []


def test_values_at_their_column_size_fit():
    assert _problems(alertname="A" * 256, node="n" * 253, gpu="g" * 128) == []


@pytest.mark.parametrize(
    ("changes", "field", "limit"),
    [
        ({"alertname": "A" * 257}, "alerts.0.labels.alertname", 256),
        ({"node": "n" * 254}, "alerts.0.labels.node", 253),
        ({"gpu": "g" * 129}, "alerts.0.labels.UUID", 128),
    ],
)
def test_a_value_longer_than_its_column_is_named_with_the_limit(changes, field, limit):
    [problem] = _problems(**changes)
    assert problem["field"] == field
    assert f"at most {limit}" in problem["message"]


@pytest.mark.parametrize("label", ["node", "Hostname", "hostname", "kubernetes_node", "instance"])
def test_every_label_a_playbook_may_take_the_node_from_is_held_to_the_node_limit(label):
    assert _fields(_labels({label: "n" * 254})) == [f"alerts.0.labels.{label}"]


@pytest.mark.parametrize("label", ["UUID", "pci_bus_id", "gpu"])
def test_every_label_a_playbook_may_take_the_gpu_from_is_held_to_the_gpu_limit(label):
    assert _fields(_labels({label: "g" * 129})) == [f"alerts.0.labels.{label}"]


def test_instance_is_measured_without_its_port_as_playbooks_take_it():
    assert _labels({"instance": "n" * 253 + ":9400"}) == []
    assert _fields(_labels({"instance": "n" * 254 + ":9400"})) == ["alerts.0.labels.instance"]


def test_a_short_node_label_that_is_no_valid_node_name_is_not_refused():
    """Stored as it is; actions check node names before any Kubernetes call."""
    assert _labels({"node": "GPU Node 01\n", "instance": "[fe80::1]:9400"}) == []


def test_other_labels_and_annotations_have_bounds_no_real_alert_comes_near():
    assert _fields(_labels({"modelName": "x" * 4097})) == ["alerts.0.labels.modelName"]
    assert _labels({"modelName": "x" * 4096}) == []
    raw = json.loads(alert_body())
    raw["alerts"][0]["annotations"]["description"] = "x" * 32769
    problems = alerts.check_limits(alerts.parse_payload(json.dumps(raw).encode()))
    assert _fields(problems) == ["alerts.0.annotations.description"]


def test_too_many_or_too_long_label_names_are_named():
    many = {f"label_{i}": "v" for i in range(130)}
    assert _fields(_labels(many)) == ["alerts.0.labels"]
    [problem] = _labels({"n" * 257: "v"})
    assert problem["field"].startswith("alerts.0.labels.nnnn")
    assert "at most 256" in problem["message"]


def test_every_alert_of_a_group_is_checked_and_each_problem_named():
    raw = json.loads(alert_body())
    second = json.loads(json.dumps(raw["alerts"][0]))
    second["labels"]["node"] = "n" * 300
    second["labels"]["gpu"] = "g" * 300
    raw["alerts"].append(second)
    problems = alerts.check_limits(alerts.parse_payload(json.dumps(raw).encode()))
    assert _fields(problems) == ["alerts.1.labels.node", "alerts.1.labels.gpu"]


@pytest.mark.parametrize(
    "name", ["alertname", "instance", "node", "Hostname", "gpu", "UUID", "team", "x" * 257]
)
def test_the_quick_check_finds_what_the_full_walk_finds(name):
    """``check_limits`` proves most deliveries fit without walking every entry; around every
    limit it answers exactly what the walk of every entry answers."""
    lengths = (1, 127, 128, 129, 252, 253, 254, 256, 257, 4096, 4097)
    for length in lengths:
        for value in ("v" * length, "v" * length + ":9400", "[" + "v" * length + "]:9400"):
            raw = json.loads(alert_body())
            raw["alerts"][0]["labels"][name] = value
            raw["alerts"][0]["annotations"]["note"] = "a" * (length * 8)
            payload = alerts.parse_payload(json.dumps(raw).encode())
            assert alerts.check_limits(payload) == alerts._limit_problems(payload), (name, value)
    for count in (alerts.MAX_ENTRIES - 1, alerts.MAX_ENTRIES, alerts.MAX_ENTRIES + 1):
        raw = json.loads(alert_body())
        raw["alerts"][0]["annotations"] = {f"a{i}": "x" for i in range(count)}
        payload = alerts.parse_payload(json.dumps(raw).encode())
        assert alerts.check_limits(payload) == alerts._limit_problems(payload), count


class _Untouchable(dict):
    """Labels that fail the test if anything reads their entries."""

    def __iter__(self):
        raise AssertionError("the labels were walked")

    def __len__(self):
        raise AssertionError("the labels were counted")

    def values(self):
        raise AssertionError("the labels were walked")


def test_a_payload_parsed_within_the_bounds_is_not_walked_again():
    """``parse_payload`` proves most deliveries storable as it parses them (pydantic's core
    holds every entry within bounds under which none can exceed a limit); ``check_limits``
    then reads none of their entries, where walking them in Python was 5 % of a delivery."""
    payload = alerts.parse_payload(alert_body())
    for alert in payload.alerts:
        object.__setattr__(alert, "labels", _Untouchable(alert.labels))
        object.__setattr__(alert, "annotations", _Untouchable(alert.annotations))
    assert alerts.check_limits(payload) == []


@pytest.mark.parametrize("length", [alerts.MAX_ANNOTATION_VALUE, alerts.MAX_ANNOTATION_VALUE + 1])
def test_a_payload_beyond_the_bounds_is_still_parsed_and_walked(length):
    """A label longer than the bounds (a 129-character model name fits its own limit) or an
    annotation at its limit is parsed again without the bounds and each entry checked."""
    raw = json.loads(alert_body())
    raw["alerts"][0]["labels"]["modelName"] = "m" * 129
    raw["alerts"][0]["annotations"]["description"] = "d" * length
    payload = alerts.parse_payload(json.dumps(raw).encode())
    assert payload.alerts[0].labels["modelName"] == "m" * 129
    expected = [] if length == alerts.MAX_ANNOTATION_VALUE else ["alerts.0.annotations.description"]
    assert _fields(alerts.check_limits(payload)) == expected


def test_an_invalid_payload_beyond_the_bounds_names_what_is_invalid():
    raw = json.loads(alert_body())
    raw["alerts"][0]["labels"]["node"] = "n" * 300
    raw["alerts"][0]["status"] = "exploded"
    with pytest.raises(pydantic.ValidationError) as caught:
        alerts.parse_payload(json.dumps(raw).encode())
    assert [f["field"] for f in alerts.validation_fields(caught.value)] == ["alerts.0.status"]


_LENGTHS = st.sampled_from([0, 1, 40, 127, 128, 129, 253, 254, 256, 257, 1024, 1025, 4096, 4097])
_NAMES = st.one_of(
    st.sampled_from(["alertname", "node", "instance", "Hostname", "gpu", "UUID", "team"]),
    _LENGTHS.map(lambda n: "k" * n),
)
_VALUES = st.one_of(
    _LENGTHS.map(lambda n: "v" * n),
    _LENGTHS.map(lambda n: "v" * n + ":9400"),
    st.integers(),  # invalid: a label value is a string
)


def _plain(body: bytes) -> tuple[str, list[dict[str, str]]]:
    """What the plain model and the full walk make of a body."""
    try:
        payload = alerts.WebhookPayload.model_validate_json(body)
    except pydantic.ValidationError as e:
        return "invalid", alerts.validation_fields(e)
    return "parsed", alerts._limit_problems(payload)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.dictionaries(_NAMES, _VALUES, max_size=4),
    annotations=st.dictionaries(_NAMES, _VALUES, max_size=3),
    extra=st.sampled_from([0, alerts.MAX_ENTRIES - 1, alerts.MAX_ENTRIES + 1]),
)
def test_the_parser_and_the_plain_model_with_the_full_walk_agree(labels, annotations, extra):
    """Whatever labels and annotations arrive, ``parse_payload`` then ``check_limits`` answer
    exactly what the plain model and the walk of every entry answer: the same validation
    errors, or the same storage problems, or none."""
    raw = json.loads(alert_body())
    raw["alerts"][0]["labels"] = {"alertname": "GPUXidError79"} | labels
    raw["alerts"][0]["annotations"] = annotations | {f"a{i}": "x" for i in range(extra)}
    body = json.dumps(raw).encode()
    try:
        payload = alerts.parse_payload(body)
    except pydantic.ValidationError as e:
        ours = ("invalid", alerts.validation_fields(e))
    else:
        ours = ("parsed", alerts.check_limits(payload))
    assert ours == _plain(body)
