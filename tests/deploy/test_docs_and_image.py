"""deploy/README.md commands run, the tokens example is safe, the Dockerfile is hardened."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib

import kubernetes_validate
import pytest
import yaml

from . import tools

README = tools.DEPLOY / "README.md"
DOCKERFILE = tools.DEPLOY / "Dockerfile"
TOKENS_EXAMPLE = tools.KUSTOMIZE / "base" / "tokens.example.yaml"
ROLES = {"ingest", "operator", "auditor", "admin"}
OFFLINE = ("kubectl kustomize ", "promtool ", "amtool ", "python tests/deploy/rulefiles.py ")


def readme_commands() -> list[str]:
    """Commands of the ```sh blocks, continuation lines joined, comments dropped."""
    text = README.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command:
                commands.append(command)
    return commands


def offline_part(command: str) -> str | None:
    """The part of a README command that runs without a cluster, if any."""
    if command.startswith(OFFLINE):
        return command.split(" > ")[0]
    if "--dry-run=client" in command:
        return command.split(" | ")[0]
    return None


def test_readme_commands_that_need_no_cluster_succeed() -> None:
    ran = 0
    for command in readme_commands():
        part = offline_part(command)
        if part is None:
            continue
        argv = shlex.split(part)
        if argv[0] == "python":
            result = subprocess.run(
                [sys.executable, *argv[1:]],
                cwd=tools.REPO,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 0, f"{part}\n{result.stderr}"
        else:
            tools.run(argv[0], argv[1:])
        ran += 1
    assert ran >= 7


def test_tokens_example_lists_placeholder_hashes_with_known_roles() -> None:
    entries = yaml.safe_load(TOKENS_EXAMPLE.read_text(encoding="utf-8"))
    assert isinstance(entries, list)
    assert entries
    for entry in entries:
        assert set(entry) == {"name", "token_sha256", "roles"}
        assert re.fullmatch(r"[0-9a-f]{64}", entry["token_sha256"])
        assert len(set(entry["token_sha256"])) == 1, "example hashes must be obvious fakes"
        assert set(entry["roles"]) <= ROLES
    assert {role for e in entries for role in e["roles"]} == ROLES


@pytest.mark.usefixtures("no_network")
def test_token_secret_made_as_documented_is_a_valid_secret() -> None:
    out = tools.run(
        "kubectl",
        [
            "-n",
            "remediator",
            "create",
            "secret",
            "generic",
            "remediator-tokens",
            f"--from-file=tokens.yaml={TOKENS_EXAMPLE.relative_to(tools.REPO)}",
            "--dry-run=client",
            "-o",
            "yaml",
        ],
    )
    secret = yaml.safe_load(out)
    secret["metadata"].pop("creationTimestamp", None)
    kubernetes_validate.validate(secret, kubernetes_validate.latest_version(), strict=True)
    assert set(secret["data"]) == {"tokens.yaml"}


def dockerfile() -> list[str]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def test_image_is_multi_stage_and_runs_remediator_serve_as_uid_10001() -> None:
    lines = dockerfile()
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) == 2
    assert all(s.split()[1] == "python:3.11-slim" for s in stages)
    final = lines[lines.index(stages[1]) :]
    assert "USER 10001:10001" in final
    assert final[-2:] == ['ENTRYPOINT ["remediator"]', 'CMD ["serve"]']
    assert any(re.search(r"pip install \.$", line) for line in lines)
    assert "COPY rules /app/rules" in final
    assert "COPY migrations /app/migrations" in final
    assert any("PYTHONDONTWRITEBYTECODE=1" in line for line in final), "read-only root"


def test_everything_the_image_copies_from_the_context_exists() -> None:
    pyproject = tomllib.loads((tools.REPO / "pyproject.toml").read_text(encoding="utf-8"))
    sources = []
    for line in dockerfile():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    assert pyproject["project"]["readme"] in sources, "hatchling needs the readme to build"
    for source in sources:
        assert (tools.REPO / source).exists(), f"the image build needs {source}"
