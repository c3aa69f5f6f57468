from __future__ import annotations

import pathlib
import textwrap

import pytest

from remediator.actions import builtin_registry
from remediator.adapters import files
from tests.conftest import ROOT
from tests.support import recording


@pytest.fixture
def registry():
    registry = builtin_registry()
    recording.register(registry)
    return registry


def _write(tmp_path: pathlib.Path, text: str, name: str = "p.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_every_shipped_playbook_loads(registry):
    loaded, problems = files.load_playbooks([ROOT / "rules"], registry)
    assert problems == []
    assert loaded


def test_lint_reports_every_problem_with_file_path_and_reason(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: Bad Name
        match:
          alertname: GPUXidError79
          matchers: ['severity=~"("']
        steps:
          - id: a
            action: nope
          - id: b
            action: log
            params: {message: "{{ labels.node | upper }}"}
          - id: c
            action: notify
            params: {channel: "bad channel!", message: hi, extra: 1}
        """,
    )
    _, problems = files.load_playbooks([path], registry)
    rendered = [str(p) for p in problems]
    assert all(p.file == str(path) for p in problems)
    assert any(p.path == "name" for p in problems), rendered
    assert any(p.path.startswith("match.matchers.0") for p in problems), rendered
    assert any("template" in p.reason for p in problems), rendered


def test_step_params_are_checked_against_the_action_model(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: p
        match: {alertname: A}
        steps:
          - id: a
            action: nope
          - id: c
            action: notify
            params: {channel: "bad channel!", message: hi, extra: 1}
          - id: d
            action: log
            params: {message: "{{ labels.node }}", level: loud}
        """,
    )
    _, problems = files.load_playbooks([path], registry)
    paths = sorted(p.path for p in problems)
    assert paths == [
        "steps.0.action",
        "steps.c.params.channel",
        "steps.c.params.extra",
        "steps.d.params.level",
    ]


def test_templated_params_are_deferred_to_run_time(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: p
        match: {alertname: A}
        steps:
          - {id: a, action: notify, params: {channel: "{{ labels.team }}", message: x}}
        """,
    )
    loaded, problems = files.load_playbooks([path], registry)
    assert problems == []
    assert loaded[0].name == "p"


def test_duplicate_names_and_step_ids_are_reported(tmp_path, registry):
    body = """
        name: same
        match: {alertname: A}
        steps:
          - {id: a, action: log, params: {message: x}}
        """
    one = _write(tmp_path, body, "one.yaml")
    _write(tmp_path, body, "two.yaml")
    dup_steps = _write(
        tmp_path,
        """
        name: other
        match: {alertname: A}
        steps:
          - {id: a, action: log, params: {message: x}}
          - {id: a, action: log, params: {message: y}}
        """,
        "three.yaml",
    )
    loaded, problems = files.load_playbooks([tmp_path], registry)
    assert [p.name for p in loaded] == ["same"]
    assert [(p.file, p.path, p.reason) for p in problems] == [
        (str(dup_steps), "(document)", "Value error, duplicate step ids: a"),
        (str(tmp_path / "two.yaml"), "name", f"duplicate of {one}"),
    ]


def test_invalid_yaml_names_the_line(tmp_path, registry):
    path = _write(tmp_path, "name: p\nsteps: [\n")
    _, problems = files.load_playbooks([path], registry)
    assert len(problems) == 1
    assert problems[0].path.startswith("line ")


def test_undo_needs_an_action_that_can_undo(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: p
        match: {alertname: A}
        steps:
          - {id: a, action: log, params: {message: x}, undo: true}
          - {id: b, action: test.record, undo: true}
        """,
    )
    _, problems = files.load_playbooks([path], registry)
    assert [(p.path, p.reason) for p in problems] == [("steps.0.undo", "action log has no undo")]


def test_manual_and_alert_playbooks_are_distinguished(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: p
        steps:
          - {id: a, action: log, params: {message: x}}
        """,
    )
    _, problems = files.load_playbooks([path], registry)
    assert "match is required" in problems[0].reason


def test_a_few_aliases_are_fine(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: shared-params
        match: {alertname: GPUXidError79}
        steps:
          - {id: one, action: test.record, params: &label {label: same}}
          - {id: two, action: test.record, params: *label}
        """,
    )
    loaded, problems = files.load_playbooks([path], registry)
    assert problems == []
    assert [s.params for s in loaded[0].steps] == [{"label": "same"}] * 2


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path, registry):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    loaded, problems = files.load_playbooks([path], registry)
    assert loaded == []
    [problem] = problems
    assert "more than 100 aliases" in problem.reason
    assert problem.path.startswith("line ")


def test_a_file_past_the_size_limit_is_refused_unparsed(tmp_path, registry):
    path = tmp_path / "huge.yaml"
    path.write_text("# " + "x" * files.MAX_FILE_BYTES + "\n")
    loaded, problems = files.load_playbooks([path], registry)
    assert loaded == []
    assert problems[0].reason == f"cannot read: larger than {files.MAX_FILE_BYTES} bytes"


def test_the_tokens_file_has_the_same_limits(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text("- &t0 {}\n" + "- *t0\n" * 150)
    with pytest.raises(files.TokensInvalid, match="more than 100 aliases"):
        files.load_tokens(path)
