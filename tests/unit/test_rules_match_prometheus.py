"""The shipped playbooks (rules/) and the shipped Prometheus alert rules agree.

Every playbook answers alert names that exist, matches and templates only labels the alert
carries (the dcgm-exporter series labels survive because no rule aggregates, plus the rule's
own labels), every rule is answered, and every captured Alertmanager fixture reaches a
playbook. ``remediator lint rules`` passes as a real process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from remediator.actions import builtin_registry
from remediator.adapters import files
from remediator.domain import playbooks
from tests.conftest import AM_FIXTURES, ROOT

RULE_FILE = ROOT / "deploy" / "prometheus" / "gpu-alerts.yaml"

# What dcgm-exporter puts on every series (see the Alertmanager reference), what Prometheus
# adds (instance, job, the relabelled node) and the external label of the captured fixtures.
EXPORTER_LABELS = frozenset(
    {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "hostname",
        "DCGM_FI_DRIVER_VERSION",
        "instance",
        "job",
        "node",
        "cluster",
    }
)
# Only on series of GPUs allocated to a pod (exported_* when the scrape does not honour labels).
WORKLOAD_LABELS = frozenset(
    {"pod", "namespace", "container", "exported_pod", "exported_namespace", "exported_container"}
)
_AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|topk|bottomk|group)\b\s*(by|without)?\s*\(")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)


def alert_rules() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))
    return {
        rule["alert"]: rule
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def shipped_playbooks() -> list[playbooks.Playbook]:
    loaded, problems = files.load_playbooks([ROOT / "rules"], builtin_registry())
    assert problems == []
    return loaded


def alert_playbooks() -> list[playbooks.Playbook]:
    return [p for p in shipped_playbooks() if p.match is not None]


def carried_labels(rule: dict[str, Any]) -> frozenset[str]:
    """Labels an alert of ``rule`` can carry: the series' labels (no aggregation) + its own."""
    assert not _AGGREGATION.search(rule["expr"]), f"{rule['alert']} aggregates: review labels"
    return EXPORTER_LABELS | WORKLOAD_LABELS | set(rule.get("labels", {})) | {"alertname"}


def guaranteed_labels(rule: dict[str, Any]) -> frozenset[str]:
    """Labels every alert of ``rule`` has; workload labels only where the expression demands
    a pod (GPUUtilizationLow: ``exported_pod!=""`` or ``pod!=""``)."""
    return EXPORTER_LABELS - {"hostname", "cluster"} | set(rule.get("labels", {})) | {"alertname"}


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def template_chains(playbook: playbooks.Playbook) -> list[list[str]]:
    """Every ``{{ a or b or "x" }}`` of every step (and undo) as its list of alternatives."""
    chains = []
    for step in playbook.steps:
        undo = step.undo_spec
        for text in strings([step.params, undo.params if undo else {}]):
            for found in _TEMPLATE.finditer(text):
                chains.append([part.strip() for part in re.split(r"\s+or\s+", found[1].strip())])
    return chains


def template_labels(playbook: playbooks.Playbook) -> set[str]:
    return {
        part.split(".", 1)[1]
        for chain in template_chains(playbook)
        for part in chain
        if part.startswith("labels.")
    }


@pytest.mark.parametrize("playbook", alert_playbooks(), ids=lambda p: p.name)
def test_every_playbook_answers_alert_rules_that_exist(playbook: playbooks.Playbook) -> None:
    assert playbook.match is not None
    missing = set(playbook.match.alertnames) - set(alert_rules())
    assert not missing, f"{playbook.name} answers alerts no rule fires: {sorted(missing)}"


@pytest.mark.parametrize("playbook", alert_playbooks(), ids=lambda p: p.name)
def test_every_label_a_playbook_uses_is_carried_by_its_rules(playbook: playbooks.Playbook) -> None:
    """Matchers: by every rule the playbook answers; templates: by at least one of them (the
    optional-label test below checks the others reach a fallback)."""
    assert playbook.match is not None
    rules = alert_rules()
    carried_by = {name: carried_labels(rules[name]) for name in playbook.match.alertnames}
    for alertname, carried in carried_by.items():
        unknown = {m.name for m in playbook.match.matchers} - carried
        assert not unknown, f"{playbook.name}: {alertname} never carries {sorted(unknown)}"
    unknown = template_labels(playbook) - set().union(*carried_by.values())
    assert not unknown, f"{playbook.name}: no rule it answers carries {sorted(unknown)}"


@pytest.mark.parametrize("playbook", alert_playbooks(), ids=lambda p: p.name)
def test_optional_labels_in_templates_have_a_fallback(playbook: playbooks.Playbook) -> None:
    """A template must not fail planning because a label only some alerts carry is absent."""
    assert playbook.match is not None
    rules = alert_rules()
    for alertname in playbook.match.alertnames:
        rule = rules[alertname]
        guaranteed = guaranteed_labels(rule)
        needs_pod = "pod!=" in rule["expr"]
        for chain in template_chains(playbook):
            last = chain[-1]
            if last.startswith('"') or not last.startswith("labels."):
                continue  # ends in a literal, or in target/alert/annotations/params
            labels = {part.split(".", 1)[1] for part in chain if part.startswith("labels.")}
            if labels & guaranteed:
                continue
            pod_pair = {"pod", "exported_pod"} <= labels or {
                "namespace",
                "exported_namespace",
            } <= labels
            demanded = needs_pod and pod_pair
            assert demanded, (
                f"{playbook.name}: {{{{ {' or '.join(chain)} }}}} has no fallback but "
                f"{alertname} does not always carry {sorted(labels)}"
            )


@pytest.mark.parametrize("playbook", alert_playbooks(), ids=lambda p: p.name)
def test_matchers_accept_the_values_the_rules_set(playbook: playbooks.Playbook) -> None:
    assert playbook.match is not None
    rules = alert_rules()
    for alertname in playbook.match.alertnames:
        own = {k: v for k, v in rules[alertname].get("labels", {}).items() if "{{" not in v}
        for matcher in playbook.match.matchers:
            if matcher.name in own:
                assert matcher.matches(own), f"{playbook.name}: {matcher} never matches {alertname}"


@pytest.mark.parametrize("playbook", alert_playbooks(), ids=lambda p: p.name)
def test_every_rule_carries_a_node_label_the_playbook_targets(
    playbook: playbooks.Playbook,
) -> None:
    assert playbook.match is not None
    for alertname in playbook.match.alertnames:
        guaranteed = guaranteed_labels(alert_rules()[alertname])
        assert set(playbook.target.node_labels) & guaranteed, alertname


def test_every_alert_rule_is_answered_by_a_playbook() -> None:
    answered = {name for p in alert_playbooks() if p.match for name in p.match.alertnames}
    assert set(alert_rules()) - answered == set()


def test_every_alertmanager_fixture_reaches_a_playbook() -> None:
    index = playbooks.PlaybookIndex(shipped_playbooks())
    paths = sorted(AM_FIXTURES.glob("*.json"))
    assert paths
    for path in paths:
        for alert in json.loads(path.read_bytes())["alerts"]:
            matched = index.match(alert["labels"])
            assert matched, f"{path.name}: {alert['labels']['alertname']} matches no playbook"
            assert alert["labels"]["alertname"] in alert_rules()


def test_manual_runbooks_need_no_alert() -> None:
    manual = {p.name: p for p in shipped_playbooks() if p.manual}
    assert set(manual) == {"return-node-to-service", "fleet-health-sweep", "gpu-driver-upgrade"}
    assert manual["fleet-health-sweep"].exclusive is False
    upgrade = manual["gpu-driver-upgrade"]
    assert (upgrade.exclusive, upgrade.concurrency, upgrade.target.require_node) == (
        False,
        1,
        False,
    )
    assert upgrade.parameters["batch_size"].default == 1
    assert upgrade.step("rollout").requires_approval
    assert manual["fleet-health-sweep"].target.require_node is False
    node = manual["return-node-to-service"].parameters["node"]
    assert node.required
    _, problems = playbooks.validate_parameters({"node": node}, {"node": "gpu-node-01"})
    assert problems == []
    _, problems = playbooks.validate_parameters({"node": node}, {"node": "Bad_Node; rm"})
    assert problems


def test_remediator_lint_rules_passes() -> None:
    cli = ROOT / ".venv" / "bin" / "remediator"
    argv = [str(cli)] if cli.exists() else [sys.executable, "-m", "remediator.cli"]
    result = subprocess.run(
        [*argv, "lint", "rules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(list((ROOT / 'rules').glob('*.yaml')))} playbook(s) OK" in result.stdout
