from __future__ import annotations

import json
import logging

import pydantic
import pytest

from remediator.app import logs, settings


def test_config_file_then_environment_then_command_line(tmp_path, monkeypatch):
    config = tmp_path / "remediator.yaml"
    config.write_text(
        "listen: 0.0.0.0:9000\nrules: /etc/remediator/rules\npoll_interval: 3\n"
        "guards: {max_nodes: 4}\n"
    )
    monkeypatch.setenv("REMEDIATOR_POLL_INTERVAL", "2")
    monkeypatch.setenv("REMEDIATOR_GUARDS__MAX_NODES", "6")
    loaded = settings.load(config, listen="127.0.0.1:9100")
    assert loaded.listen == "127.0.0.1:9100"  # command line wins
    assert loaded.poll_interval == 2  # environment beats the file
    assert str(loaded.rules) == "/etc/remediator/rules"  # from the file
    assert loaded.guards.max_nodes == 6


def test_defaults_are_the_embedded_ones(monkeypatch):
    for name in ("REMEDIATOR_DATABASE_URL", "REMEDIATOR_RULES", "REMEDIATOR_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    loaded = settings.load()
    assert loaded.database_url == "sqlite+aiosqlite:///remediator.db"
    assert str(loaded.rules) == "rules"
    assert loaded.listen == "127.0.0.1:8080"
    assert loaded.should_migrate is True


@pytest.mark.parametrize("bad", [{"listen": "nope"}, {"poll_interval": 0}, {"unknown": 1}])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(pydantic.ValidationError):
        settings.Settings(**bad)


def test_a_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        settings.load(tmp_path / "absent.yaml")


def test_logs_are_one_json_object_per_line_with_extra_fields():
    record = logging.LogRecord(
        "remediator.engine", logging.WARNING, __file__, 1, "step %s lost", (7,), None
    )
    record.run_id = 3
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["message"] == "step 7 lost"
    assert line["level"] == "warning"
    assert line["run_id"] == 3
    assert line["time"].endswith("+00:00")


def test_notify_channels_of_every_type_are_accepted(monkeypatch, tmp_path):
    monkeypatch.setenv("TEAMS_URL", "https://example.webhook.office.com/workflows/abc")
    key = tmp_path / "pd-key"
    key.write_text("R0UTINGKEY\n")
    loaded = settings.Settings(
        alertmanager_url="http://alertmanager.monitoring:9093",
        notify_channels={
            "default": {"url": "https://hooks.example.test/x"},
            "chat": {"type": "slack", "url": "https://hooks.slack.com/services/T/B/s3cr3t"},
            "teams": {"type": "msteams", "url_env": "TEAMS_URL"},
            "page": {"type": "pagerduty", "routing_key_file": str(key)},
            "am": {"type": "alertmanager"},
        },
        notify_routing={
            "routes": [{"matchers": ['severity="critical"'], "channel": "page"}],
            "owner": {"channels": {"research": "teams"}},
        },
    )
    channels = loaded.notify_channels
    assert channels["default"].type == "webhook"
    assert channels["page"].resolve_url() == "https://events.pagerduty.com/v2/enqueue"
    assert channels["page"].resolve_routing_key() == "R0UTINGKEY"
    assert channels["am"].resolve_url() == "http://alertmanager.monitoring:9093/api/v2/alerts"
    assert channels["teams"].resolve_url().endswith("/workflows/abc")
    assert "s3cr3t" not in repr(loaded)


@pytest.mark.parametrize(
    ("channel", "problem"),
    [
        (
            {"type": "discord", "url": "https://x.test"},
            "Input should be 'webhook', 'slack', 'msteams', 'pagerduty' or 'alertmanager'",
        ),
        ({"type": "slack"}, "a slack channel needs url, url_file or url_env"),
        ({"url": "https://x.test", "url_env": "X"}, "at most one of url, url_file, url_env"),
        ({"type": "pagerduty"}, "exactly one of routing_key"),
        ({"url": "https://x.test", "routing_key": "k"}, "routing_key is for pagerduty"),
        ({"url": "ftp://x.test/s3cr3t"}, r"url is not an http\(s\) URL"),
        ({"url_env": "REMEDIATOR_TEST_UNSET_URL"}, "REMEDIATOR_TEST_UNSET_URL is not set"),
        ({"url_file": "/nonexistent/url"}, "url_file /nonexistent/url cannot be read"),
        ({"url": "https://x.test", "templates": {"*": "{{ alert.x }}"}}, "template for '\\*'"),
        ({"type": "alertmanager"}, "alertmanager channel needs url"),
    ],
)
def test_bad_notify_channels_are_refused_without_echoing_secrets(channel, problem):
    with pytest.raises(pydantic.ValidationError, match=problem) as info:
        settings.Settings(notify_channels={"c": channel})
    assert "s3cr3t" not in str(info.value)


def test_routing_may_only_name_configured_channels():
    with pytest.raises(pydantic.ValidationError, match=r"not configured: \['pager'\]"):
        settings.Settings(
            notify_channels={"default": {"url": "https://x.test"}},
            notify_routing={"routes": [{"matchers": ['a="b"'], "channel": "pager"}]},
        )
    # the default channel may be left unconfigured: its notices are logged only
    settings.Settings(notify_routing={"default_channel": "nowhere"})


def test_notify_channels_and_routing_come_from_the_environment_as_json(monkeypatch):
    monkeypatch.setenv("SLACK_URL", "https://hooks.slack.com/services/T/B/x")
    monkeypatch.setenv(
        "REMEDIATOR_NOTIFY_CHANNELS", '{"default": {"type": "slack", "url_env": "SLACK_URL"}}'
    )
    monkeypatch.setenv("REMEDIATOR_NOTIFY_ROUTING__OWNER__KEYS", '["squad"]')
    loaded = settings.load()
    assert loaded.notify_channels["default"].resolve_url().endswith("/T/B/x")
    assert loaded.notify_routing.owner.keys == ["squad"]
