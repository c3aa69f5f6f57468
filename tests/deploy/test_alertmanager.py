"""deploy/alertmanager/receiver.yaml: valid for amtool, routes GPU alerts to remediator."""

from __future__ import annotations

import re

import yaml

from . import rulefiles, tools

RECEIVER = tools.DEPLOY / "alertmanager" / "receiver.yaml"


def load() -> dict:
    return yaml.safe_load(RECEIVER.read_text(encoding="utf-8"))


def test_amtool_accepts_the_configuration() -> None:
    out = tools.run("amtool", ["check-config", RECEIVER])
    assert "SUCCESS" in out


def test_gpu_route_groups_by_alert_and_node_and_delivers_to_remediator() -> None:
    config = load()
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "remediator"]
    assert route["group_by"] == ["alertname", "node"]
    assert route["continue"] is True
    (matcher,) = route["matchers"]
    pattern = re.fullmatch(r'alertname =~ "(.*)"', matcher)
    assert pattern
    gpu = rulefiles.alert_rules(rulefiles.load_groups(rulefiles.GPU_RULES))
    own = rulefiles.alert_rules(rulefiles.load_groups(rulefiles.SELF_RULES))
    assert all(re.fullmatch(pattern.group(1), name) for name in gpu)
    assert not any(re.fullmatch(pattern.group(1), name) for name in own), "feedback loop"


def test_webhook_sends_everything_with_a_bearer_token_from_a_file() -> None:
    (receiver,) = [r for r in load()["receivers"] if r["name"] == "remediator"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["url"].startswith("http://remediator.remediator.svc:8080/")
    assert webhook["send_resolved"] is True
    assert webhook["max_alerts"] == 0
    assert webhook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/alertmanager/secrets/remediator-token",
    }
