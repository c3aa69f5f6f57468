"""Which pod and container remediator execs into is chosen by literals or settings, never by
alert data: a template in an exec-target param is refused when playbooks load."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

from remediator import cli
from remediator.actions import builtin_registry
from remediator.adapters import files
from remediator.domain import playbooks
from tests.support import recording

EXEC_ACTIONS = [
    "gpu.power_cap",
    "gpu.recovery_action",
    "gpu.verify_healthy",
    "gpu.collect_bug_report",
    "gpu.health_report",
    "gpu.diagnose",
    "gpu.drain_workloads",
    "gpu.reset",
    "gpu.row_remap_status",
    "gpu.upgrade_driver",
    "gpu.verify_pcie",
    "node.mark_for_replacement",
    "node.reboot",
]
POD_ACTIONS = ["gpu.cuda_smoke_test"]
"""Actions whose ``namespace`` is where they create a pod: a literal too."""
EXTRA = {
    "gpu.power_cap": {"percent_of_default": 70},
    "gpu.upgrade_driver": {"target_version": "570.124.06"},
}


@pytest.fixture
def registry():
    registry = builtin_registry()
    recording.register(registry)
    return registry


def _write(tmp_path: pathlib.Path, text: str, name: str = "p.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _playbook(action: str, params: dict[str, object]) -> str:
    rendered = ", ".join(
        f"{key}: {value!r}" for key, value in {**EXTRA.get(action, {}), **params}.items()
    )
    return f"""
        name: p
        match: {{alertname: GPUXidError}}
        steps:
          - id: probe
            action: {action}
            params: {{{rendered}}}
        """


@pytest.mark.parametrize("action", EXEC_ACTIONS)
@pytest.mark.parametrize(
    ("field", "template"),
    [
        ("driver_namespace", "{{ labels.namespace }}"),
        ("driver_selector", 'app={{ labels.pod or "x" }}'),
        ("driver_container", "{{ annotations.container }}"),
    ],
)
def test_an_exec_target_taken_from_alert_labels_is_a_lint_error(
    tmp_path, registry, action, field, template
):
    path = _write(tmp_path, _playbook(action, {field: template}))
    loaded, problems = files.load_playbooks([path], registry)
    assert loaded == []
    assert [(p.file, p.path) for p in problems] == [(str(path), f"steps.probe.params.{field}")]
    assert "execs into" in problems[0].reason
    assert "never a template" in problems[0].reason


@pytest.mark.parametrize("action", EXEC_ACTIONS)
def test_literal_exec_targets_and_the_settings_default_load(tmp_path, registry, action):
    literal = _write(
        tmp_path,
        _playbook(
            action,
            {
                "driver_namespace": "gpu-operator",
                "driver_selector": "app=nvidia-driver-daemonset",
                "driver_container": "nvidia-driver-ctr",
            },
        ),
        "literal.yaml",
    )
    loaded, problems = files.load_playbooks([literal], registry)
    assert problems == []
    assert len(loaded) == 1
    default = _write(tmp_path, _playbook(action, {}).replace("name: p", "name: q"), "default.yaml")
    loaded, problems = files.load_playbooks([default], registry)
    assert problems == []


def test_a_manual_runbook_parameter_cannot_choose_the_exec_target_either(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: p
        manual: true
        parameters:
          node: {required: true}
          ns: {required: true}
        steps:
          - id: verify
            action: gpu.verify_healthy
            params: {node: "{{ params.node }}", driver_namespace: "{{ params.ns }}"}
        """,
    )
    _, problems = files.load_playbooks([path], registry)
    assert [p.path for p in problems] == ["steps.verify.params.driver_namespace"]


def test_templated_exec_targets_in_undo_params_are_refused(tmp_path, registry):
    path = _write(
        tmp_path,
        """
        name: p
        match: {alertname: A}
        steps:
          - id: cap
            action: gpu.power_cap
            params: {percent_of_default: 70}
            undo:
              params: {percent_of_default: 70, driver_container: "{{ labels.container }}"}
        """,
    )
    _, problems = files.load_playbooks([path], registry)
    assert [p.path for p in problems] == ["steps.cap.undo.params.driver_container"]


def test_start_up_refuses_a_playbook_with_a_templated_exec_target(tmp_path, registry):
    path = _write(tmp_path, _playbook("gpu.power_cap", {"driver_namespace": "{{ labels.ns }}"}))
    with pytest.raises(files.RulesInvalid, match=r"steps\.probe\.params\.driver_namespace"):
        files.load_playbooks_strict([path], registry)


def test_lint_command_fails_naming_the_file_and_field(tmp_path, capsys):
    path = _write(
        tmp_path, _playbook("gpu.verify_healthy", {"driver_selector": "{{ labels.app }}"})
    )
    assert cli.main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert str(path) in out
    assert "steps.probe.params.driver_selector" in out


def test_every_builtin_driver_pod_field_is_declared_an_exec_target():
    for action in builtin_registry().all():
        # the fields that choose the driver pod and container (``driver_version`` is a value
        # a check compares with, not a place remediator execs into)
        driver_fields = {
            name
            for name in action.params_model.model_fields
            if name in ("driver_namespace", "driver_selector", "driver_container")
        }
        assert driver_fields <= playbooks.exec_target_fields(action.params_model), action.name
    declared = {
        action.name
        for action in builtin_registry().all()
        if playbooks.exec_target_fields(action.params_model)
    }
    assert declared == set(EXEC_ACTIONS) | set(POD_ACTIONS)


@pytest.mark.parametrize("action", POD_ACTIONS)
def test_the_namespace_a_pod_is_created_in_cannot_come_from_alert_labels(
    tmp_path, registry, action
):
    path = _write(tmp_path, _playbook(action, {"namespace": "{{ labels.namespace }}"}))
    loaded, problems = files.load_playbooks([path], registry)
    assert loaded == []
    assert [p.path for p in problems] == ["steps.probe.params.namespace"]


def test_exec_targets_are_marked_in_the_params_schema():
    schema = builtin_registry().get("gpu.power_cap").params_model.model_json_schema()
    assert schema["properties"]["driver_namespace"][playbooks.EXEC_TARGET] is True
    assert playbooks.EXEC_TARGET not in schema["properties"]["watts"]
