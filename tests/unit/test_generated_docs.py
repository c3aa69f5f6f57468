"""The reference docs under docs/ are what the code generates (`remediator docs` rewrites them)."""

from __future__ import annotations

import json
import subprocess
import sys

from remediator.app import docs, settings
from tests.conftest import ROOT

DOCS = ROOT / "docs"


def test_generated_docs_are_up_to_date():
    assert docs.stale(DOCS) == [], "run `remediator docs` and commit the result"


def test_docs_check_fails_on_a_stale_file(tmp_path):
    docs.write(tmp_path)
    assert docs.stale(tmp_path) == []
    (tmp_path / "actions.md").write_text("old\n")
    assert docs.stale(tmp_path) == ["actions.md"]
    result = subprocess.run(
        [sys.executable, "-m", "remediator", "docs", "--check", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "actions.md is stale" in result.stderr


def test_the_schema_file_is_what_remediator_schema_prints():
    printed = subprocess.run(
        [sys.executable, "-m", "remediator", "schema"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    ).stdout
    assert json.loads(printed) == json.loads((DOCS / "playbook-schema.json").read_text())


def test_every_setting_is_documented_with_its_environment_variable():
    text = (DOCS / "configuration.md").read_text()
    for name, field in settings.Settings.model_fields.items():
        assert f"| `{name}` | `REMEDIATOR_{name.upper()}` |" in text
        assert field.description, f"setting {name} has no description"
