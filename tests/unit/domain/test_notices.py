"""Routing notices: label routes (first match wins), the owner of a workload, the default."""

from __future__ import annotations

import pydantic
import pytest

from remediator.domain import notices, templating

ROUTING = notices.Routing.model_validate(
    {
        "default_channel": "ops",
        "routes": [
            {"matchers": ['severity="critical"', 'namespace=~"ml-.*"'], "channel": "ml-page"},
            {"matchers": ['namespace=~"ml-.*"'], "channel": "ml-chat"},
            {"matchers": ['team="infra"'], "channel": "infra"},
            {"matchers": ['node=~"gpu-node-0[1-4]"'], "channel": "rack-a"},
            {"matchers": ['owner="vision"'], "channel": "vision-chat"},
        ],
        "owner": {"keys": ["team", "owner"], "channels": {"research": "research-chat"}},
    }
)


def _choose(labels, owner=None, explicit=None) -> notices.Choice:
    return notices.choose_channel(ROUTING, explicit=explicit, labels=labels, owner=owner)


def test_the_first_matching_route_wins():
    critical = _choose({"severity": "critical", "namespace": "ml-train"})
    assert critical == notices.Choice(
        channel="ml-page", reason='route 1 (severity="critical", namespace=~"ml-.*")'
    )
    assert _choose({"severity": "warning", "namespace": "ml-train"}).channel == "ml-chat"
    assert _choose({"team": "infra", "namespace": "ml-train"}).channel == "ml-chat"
    assert _choose({"team": "infra"}).channel == "infra"
    assert _choose({"node": "gpu-node-03"}).channel == "rack-a"


def test_without_a_match_the_default_channel_is_used():
    assert _choose({"alertname": "GPUXidError"}) == notices.Choice(
        channel="ops", reason="default channel"
    )


def test_a_channel_named_by_the_step_bypasses_routing():
    chosen = _choose({"severity": "critical", "namespace": "ml-a"}, explicit="direct")
    assert chosen == notices.Choice(channel="direct", reason="named by the step")


def test_a_known_owner_picks_its_channel_before_any_route():
    owner = notices.Owner(value="research", found_at="namespace label team")
    chosen = _choose({"severity": "critical", "namespace": "ml-a"}, owner=owner)
    assert chosen == notices.Choice(
        channel="research-chat", reason="owner research (namespace label team)"
    )


def test_an_unmapped_owner_is_a_label_routes_can_match_then_the_default():
    vision = notices.Owner(value="vision", found_at="pod annotation owner")
    assert _choose({}, owner=vision).channel == "vision-chat"
    nobody = notices.Owner(value="alice", found_at="pod label owner")
    assert _choose({}, owner=nobody).channel == "ops"


def test_the_owner_is_the_first_key_on_the_pod_before_the_namespace():
    sources = [
        ("pod label", {"app": "x"}),
        ("pod annotation", {"owner": "alice"}),
        ("namespace label", {"team": "research"}),
        ("namespace annotation", {}),
    ]
    assert notices.find_owner(["team", "owner"], sources) == notices.Owner(
        value="alice", found_at="pod annotation owner"
    )
    assert notices.find_owner(["team"], sources) == notices.Owner(
        value="research", found_at="namespace label team"
    )
    assert notices.find_owner(["team"], [("pod label", {"team": "  "})]) is None


@pytest.mark.parametrize(
    ("label", "severity"),
    [
        ("critical", "critical"),
        ("page", "critical"),
        ("Warning", "warning"),
        ("info", "info"),
        ("none", "info"),
        ("error", "error"),
        ("", "warning"),
        ("bizarre", "warning"),
    ],
)
def test_alert_severities_map_to_the_four_paging_severities(label, severity):
    assert notices.severity_of(label) == severity


def test_routes_refuse_bad_channel_names_and_matchers():
    with pytest.raises(pydantic.ValidationError):
        notices.Route.model_validate({"matchers": ['a="b"'], "channel": "no spaces"})
    with pytest.raises(pydantic.ValidationError):
        notices.Route.model_validate({"matchers": ['a=~"("'], "channel": "x"})
    with pytest.raises(pydantic.ValidationError):
        notices.Route.model_validate({"matchers": [], "channel": "x"})
    with pytest.raises(pydantic.ValidationError):
        notices.OwnerLookup.model_validate({"channels": {"team": "bad name"}})


def test_templates_take_only_the_notice_namespaces_and_render_by_lookup():
    notices.validate_template('{{ notice.message }} {{ run.url }} {{ data.pod or "?" }}')
    with pytest.raises(templating.TemplateError, match="unknown namespace 'alert'"):
        notices.validate_template("{{ alert.alertname }}")
    with pytest.raises(templating.TemplateError, match=r"unknown key run\.secret"):
        notices.validate_template("{{ run.secret }}")
    text = notices.render_template(
        '{{ labels.__class__ or "x" }}: {{ notice.message }}',
        {"labels": {}, "notice": {"message": "hi"}},
    )
    assert text == "x: hi"
