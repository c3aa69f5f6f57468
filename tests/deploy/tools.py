"""Run the real tools (kubectl, promtool, amtool) that deploy/ is checked with."""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
OVERLAYS = ("single", "ha")

# binary -> the Debian package CI installs it from
PACKAGES = {
    "kubectl": "kubernetes-client",
    "promtool": "prometheus",
    "amtool": "prometheus-alertmanager",
}


def require(binary: str) -> str:
    """The path of `binary`; fails the test (never skips) when it is not installed."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"`{binary}` is not on PATH: these tests need it. "
            f"Install it with `apt-get install -y {PACKAGES[binary]}`.",
            pytrace=False,
        )
    return path


def run(binary: str, args: Sequence[str | Path], *, timeout: float = 60) -> str:
    """Run `binary args...` from the repository root; stdout, or a test failure with stderr."""
    argv = [require(binary), *map(str, args)]
    result = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}",
            pytrace=False,
        )
    return result.stdout


def render(kustomization: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <dir>` parsed into objects."""
    out = run("kubectl", ["kustomize", kustomization.relative_to(REPO)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


@functools.cache
def render_overlay(name: str) -> tuple[dict[str, Any], ...]:
    """The objects of deploy/kustomize/overlays/<name>, rendered once per test session."""
    return tuple(render(KUSTOMIZE / "overlays" / name))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]
