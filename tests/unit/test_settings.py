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
