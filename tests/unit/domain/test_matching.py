from __future__ import annotations

import pydantic
import pytest

from remediator.domain import matching, playbooks


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ('severity="critical"', {"severity": "critical"}, True),
        ('severity="critical"', {"severity": "warning"}, False),
        ('severity!="critical"', {}, True),
        ('severity=~"crit.*"', {"severity": "critical"}, True),
        ('severity=~"crit"', {"severity": "critical"}, False),
        ('severity!~"warn|info"', {"severity": "critical"}, True),
        ('severity!~"warn|info"', {"severity": "info"}, False),
        ('pod=~""', {}, True),
        ("node=gpu-node-01", {"node": "gpu-node-01"}, True),
        (r'gpu=~"\\d+"', {"gpu": "3"}, True),
    ],
)
def test_matchers_follow_alertmanager_semantics(text, labels, expected):
    assert matching.Matcher.model_validate(text).matches(labels) is expected


def test_regex_matchers_are_anchored_like_alertmanager():
    matcher = matching.Matcher(name="node", op=matching.MatchOp.RE, value="gpu-node-0")
    assert not matcher.matches({"node": "gpu-node-01"})
    assert not matcher.matches({"node": "xgpu-node-0"})
    assert matcher.matches({"node": "gpu-node-0"})


@pytest.mark.parametrize("text", ["", "severity", 'severity=~"("', "1abc=x", 'a=="b"'])
def test_malformed_matchers_are_refused(text):
    with pytest.raises(pydantic.ValidationError):
        matching.Matcher.model_validate(text)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"node": "n1", "Hostname": "h1"}, "n1"),
        ({"Hostname": "h1", "instance": "i1:9400"}, "h1"),
        ({"instance": "gpu-node-07:9400"}, "gpu-node-07"),
        ({"instance": "[fe80::1]:9400"}, "fe80::1"),
        ({"node": "", "hostname": "h2"}, "h2"),
        ({}, None),
    ],
)
def test_node_is_taken_from_the_first_non_empty_label(labels, expected):
    assert matching.first_label(labels, matching.DEFAULT_NODE_LABELS) == expected


def _playbook(name, alertname, matchers=()):
    return playbooks.Playbook.model_validate(
        {
            "name": name,
            "match": {"alertname": alertname, "matchers": list(matchers)},
            "steps": [{"id": "a", "action": "log", "params": {"message": "x"}}],
        }
    )


def test_index_only_considers_playbooks_for_the_alertname():
    index = playbooks.PlaybookIndex(
        [
            _playbook("hot", "GPUTemperatureHigh"),
            _playbook("hot-critical", "GPUTemperatureHigh", ['severity="critical"']),
            _playbook("xid", ["GPUXidError79", "GPUXidError"]),
        ]
    )
    hot = index.match({"alertname": "GPUTemperatureHigh", "severity": "warning"})
    assert [p.name for p in hot] == ["hot"]
    assert [p.name for p in index.match({"alertname": "GPUXidError"})] == ["xid"]
    assert index.match({"alertname": "Other"}) == []


def test_index_lookup_cost_does_not_depend_on_unrelated_playbooks():
    many = [_playbook(f"p{i}", f"Alert{i}") for i in range(5000)]
    index = playbooks.PlaybookIndex([*many, _playbook("target", "GPUXidError79")])
    calls = 0
    original = matching.Matcher.matches

    def counting(self, labels):
        nonlocal calls
        calls += 1
        return original(self, labels)

    matching.Matcher.matches = counting  # type: ignore[method-assign]
    try:
        assert [p.name for p in index.match({"alertname": "GPUXidError79"})] == ["target"]
    finally:
        matching.Matcher.matches = original  # type: ignore[method-assign]
    assert calls == 0


def test_manual_parameters_are_typed_and_checked():
    specs = {
        "node": playbooks.ParameterSpec(required=True, pattern="[a-z0-9-]+"),
        "force": playbooks.ParameterSpec(type="boolean", default=False),
        "limit": playbooks.ParameterSpec(type="integer"),
    }
    values, problems = playbooks.validate_parameters(specs, {"node": "gpu-node-01"})
    assert values == {"node": "gpu-node-01", "force": False}
    assert problems == []
    _, problems = playbooks.validate_parameters(
        specs, {"node": "Bad Node", "limit": True, "extra": 1}
    )
    assert sorted(p["field"] for p in problems) == ["params.extra", "params.limit", "params.node"]
    _, problems = playbooks.validate_parameters(specs, {})
    assert problems == [{"field": "params.node", "message": "required"}]
