"""The reference docs under docs/ are what the code generates (`remediator docs` rewrites them),
and so is the state-machine section of the otherwise hand-written docs/architecture.md."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from remediator.app import docs, settings
from remediator.domain import runs
from tests.conftest import ROOT

DOCS = ROOT / "docs"
START = "<!-- generated: state-machines -->"


def _remediator_docs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remediator", "docs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _outside_section(text: str) -> tuple[str, str]:
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(docs.END_SECTION)
    return before, after


def test_generated_docs_are_up_to_date():
    assert docs.stale(DOCS) == [], "run `remediator docs` and commit the result"


def test_docs_check_fails_on_a_stale_file(tmp_path):
    docs.write(tmp_path)
    assert docs.stale(tmp_path) == []
    (tmp_path / "actions.md").write_text("old\n")
    assert docs.stale(tmp_path) == ["actions.md"]
    result = _remediator_docs("--check", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "actions.md is stale" in result.stderr


def test_docs_check_fails_on_a_stale_state_machine_section_and_passes_after_docs(tmp_path):
    architecture = tmp_path / "architecture.md"
    shutil.copy(DOCS / "architecture.md", architecture)
    docs.write(tmp_path)
    fresh = architecture.read_text()
    architecture.write_text(fresh.replace("    running --> succeeded\n", "", 1))
    assert docs.stale(tmp_path) == ["architecture.md"]

    checked = _remediator_docs("--check", "--out", str(tmp_path))
    assert checked.returncode == 1
    assert "architecture.md is stale" in checked.stderr

    written = _remediator_docs("--out", str(tmp_path))
    assert written.returncode == 0, written.stderr
    assert "architecture.md" in written.stdout
    assert _remediator_docs("--check", "--out", str(tmp_path)).returncode == 0
    assert architecture.read_text() == fresh


def test_docs_rewrite_only_the_generated_section_of_a_hand_written_file(tmp_path):
    (tmp_path / "architecture.md").write_text(
        f"# Hand-written\n\nKept.\n\n{START}\nold diagram\n{docs.END_SECTION}\n\nAlso kept.\n"
    )
    docs.write(tmp_path)
    text = (tmp_path / "architecture.md").read_text()
    assert "old diagram" not in text
    assert "stateDiagram-v2" in text
    assert _outside_section(text) == ("# Hand-written\n\nKept.\n\n", "\n\nAlso kept.\n")
    assert docs.stale(tmp_path) == []


def test_the_state_diagrams_draw_every_transition_of_the_tables():
    text = (DOCS / "architecture.md").read_text()
    _, _, section = text.partition(START)
    for table in (runs.RUN_TRANSITIONS, runs.STEP_TRANSITIONS):
        for source, targets in table.items():
            for target in targets:
                assert f"    {source.value} --> {target.value}\n" in section
    for terminal in runs.RUN_TERMINAL | runs.STEP_TERMINAL:
        assert f"    {terminal.value} --> [*]\n" in section
    assert section.count("    [*] --> pending\n") == 2


def test_the_section_lists_every_transition_function_and_effect():
    section = docs.state_machines_md()
    for name in ("claim", "requeue", "finish", "make_due", "hold", "park", "approve", "end"):
        assert f"| `{name}(" in section
    assert "| `undone(original, *, by)` | step |" in section
    assert "| `move_run(run, to, *" in section
    for effect in runs.Effect:
        assert f"| `{effect.value}` |" in section
    assert "| `unknown` | yes | it reached apply" in section


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


def test_every_documented_default_is_a_value_the_setting_takes(monkeypatch):
    """A default copied from docs/configuration.md into the environment starts the server
    with that default (durations were shown as ``"0:00:15"``, which a setting refuses)."""
    import re

    rows = re.findall(
        r"^\| `\w+` \| `(REMEDIATOR_GUARDS__\w+)` \| (\w+) \| `(.+?)` \|",
        (DOCS / "configuration.md").read_text(),
        flags=re.MULTILINE,
    )
    durations = [(name, json.loads(default)) for name, kind, default in rows if kind == "duration"]
    assert ("REMEDIATOR_GUARDS__RECHECK", "15s") in durations
    defaults = settings.Settings().guards
    for name, default in durations:
        monkeypatch.setenv(name, default)
    assert settings.Settings().guards == defaults
