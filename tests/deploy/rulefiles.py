"""Prometheus rule files under deploy/prometheus: load them, shorten them, embed them.

Standalone on purpose (no relative imports), so end-to-end tests and humans can use it:

    python tests/deploy/rulefiles.py shorten deploy/prometheus/gpu-alerts.yaml --for 3s
    python tests/deploy/rulefiles.py prometheusrule > deploy/kustomize/base/prometheusrule.yaml

`shorten` is the test overlay for end-to-end runs: the same rules, every `for:` set to a few
seconds (and the "for more than <duration>" wording of the annotations with it, which is how
the captured fixtures in tests/fixtures/alertmanager-0.25 read "for more than 3s").
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
GPU_RULES = PROMETHEUS_DIR / "gpu-alerts.yaml"
SELF_RULES = PROMETHEUS_DIR / "remediator-alerts.yaml"
RULE_FILES = (GPU_RULES, SELF_RULES)
PROMETHEUS_RULE = REPO / "deploy" / "kustomize" / "base" / "prometheusrule.yaml"

_HEADER_START = "# remediator-rules:"


def load_groups(path: Path) -> list[dict[str, Any]]:
    """The `groups` list of a plain Prometheus rule file."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups = doc["groups"]
    if not isinstance(groups, list):
        raise TypeError(f"{path}: groups must be a list")
    return groups


def alert_rules(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Alert rules by name (recording rules are skipped)."""
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def load_header(path: Path) -> list[dict[str, Any]]:
    """The machine-readable comment header (`# remediator-rules:` ... up to `groups:`)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(_HEADER_START)
    block = []
    for line in lines[start:]:
        if not line.startswith("#") or line.strip() == "#":
            break
        block.append(line[2:] if line.startswith("# ") else line[1:])
    return yaml.safe_load("\n".join(block))["remediator-rules"]


def shorten_for(
    groups: list[dict[str, Any]], hold: str | Mapping[str, str]
) -> list[dict[str, Any]]:
    """A copy of `groups` whose alert rules hold for `hold` instead of their `for:`.

    `hold` is one duration for every rule that has a `for:`, or a mapping alert name ->
    duration (rules not in it keep theirs). Rules without `for:` stay without. Annotations
    saying "for more than <old>" are rewritten to the new duration.
    """
    result = copy.deepcopy(groups)
    for group in result:
        for rule in group["rules"]:
            if "alert" not in rule or "for" not in rule:
                continue
            new = hold if isinstance(hold, str) else hold.get(rule["alert"])
            if new is None:
                continue
            old = rule["for"]
            rule["for"] = new
            pattern = re.compile(rf"for\s+more\s+than\s+{re.escape(old)}\b")
            for key, text in rule.get("annotations", {}).items():
                rule["annotations"][key] = pattern.sub(f"for more than {new}", text)
    return result


def build_prometheus_rule() -> dict[str, Any]:
    """The PrometheusRule object embedding every group of RULE_FILES, in order."""
    groups = [group for path in RULE_FILES for group in load_groups(path)]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "remediator",
            "namespace": "remediator",
            "labels": {
                "app.kubernetes.io/name": "remediator",
                "app.kubernetes.io/part-of": "remediator",
            },
        },
        "spec": {"groups": groups},
    }


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


def render_prometheus_rule() -> str:
    header = (
        "# GENERATED from deploy/prometheus/gpu-alerts.yaml and remediator-alerts.yaml.\n"
        "# Do not edit: change those files, then run\n"
        "#   python tests/deploy/rulefiles.py prometheusrule"
        " > deploy/kustomize/base/prometheusrule.yaml\n"
        "# tests/deploy checks that this file matches them.\n"
    )
    return header + dump(build_prometheus_rule())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    shorten = commands.add_parser("shorten", help="print a rule file with short `for:`")
    shorten.add_argument("path", type=Path)
    shorten.add_argument("--for", dest="hold", default="3s")
    commands.add_parser("prometheusrule", help="print the PrometheusRule manifest")
    args = parser.parse_args(argv)
    if args.command == "shorten":
        groups = shorten_for(load_groups(args.path), args.hold)
        sys.stdout.write(dump({"groups": groups}))
    else:
        sys.stdout.write(render_prometheus_rule())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
