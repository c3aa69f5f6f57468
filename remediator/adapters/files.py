"""Reading the YAML files users write: playbooks (``rules/``) and the tokens file.

``lint`` reports every problem with its file, its path inside the document and the reason, and
never stops at the first.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterable
from typing import Any

import pydantic
import yaml

from remediator.domain import auth, playbooks
from remediator.ports import actions


@dataclasses.dataclass(frozen=True)
class Problem:
    file: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.reason}"


#: A playbook or tokens file larger than this is refused before parsing.
MAX_FILE_BYTES = 1024 * 1024
#: Aliases (``*name``) allowed per file: enough to share a block, too few for a "billion
#: laughs" document whose aliases of aliases expand to gigabytes once validated.
MAX_ALIASES = 100


class _Loader(yaml.SafeLoader):
    """``SafeLoader`` that counts aliases and refuses a file with more than ``MAX_ALIASES``."""

    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases", self.get_mark()
                )
        return super().compose_node(parent, index)


def _read(path: pathlib.Path) -> str:
    """The file's text, refused past ``MAX_FILE_BYTES``."""
    with path.open("rb") as stream:
        data = stream.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8")


def safe_load_all(text: str) -> list[Any]:
    """Every document of ``text``, with YAML's safe types and the alias limit."""
    return list(yaml.load_all(text, Loader=_Loader))


class RulesInvalid(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(problem) for problem in problems))
        self.problems = problems


def playbook_files(paths: Iterable[pathlib.Path]) -> list[pathlib.Path]:
    found: list[pathlib.Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted([*path.glob("*.yaml"), *path.glob("*.yml")]))
        else:
            found.append(path)
    return found


def _documents(file: pathlib.Path) -> tuple[list[Any], list[Problem]]:
    try:
        return [doc for doc in safe_load_all(_read(file)) if doc is not None], []
    except (OSError, ValueError) as e:
        return [], [Problem(str(file), "(file)", f"cannot read: {e}")]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        return [], [Problem(str(file), where, f"invalid YAML: {getattr(e, 'problem', e)}")]


def load_playbooks(
    paths: Iterable[pathlib.Path], registry: actions.Registry
) -> tuple[list[playbooks.Playbook], list[Problem]]:
    """Parse and validate every playbook; return the good ones and every problem found."""
    loaded: list[playbooks.Playbook] = []
    problems: list[Problem] = []
    origin: dict[str, str] = {}
    files = playbook_files(paths)
    for file in files:
        documents, read_problems = _documents(file)
        problems += read_problems
        for number, document in enumerate(documents):
            prefix = f"[{number}]." if len(documents) > 1 else ""
            try:
                playbook = playbooks.Playbook.model_validate(document)
            except pydantic.ValidationError as e:
                for item in e.errors(include_url=False, include_input=False):
                    path = prefix + ".".join(str(part) for part in item["loc"]) or "(document)"
                    problems.append(Problem(str(file), path, item["msg"]))
                continue
            step_problems = _check_steps(playbook, registry)
            problems += [
                Problem(str(file), prefix + path, reason) for path, reason in step_problems
            ]
            if playbook.name in origin:
                problems.append(
                    Problem(str(file), prefix + "name", f"duplicate of {origin[playbook.name]}")
                )
            elif not step_problems:
                origin[playbook.name] = str(file)
                loaded.append(playbook)
    return loaded, problems


def _check_steps(playbook: playbooks.Playbook, registry: actions.Registry) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for number, step in enumerate(playbook.steps):
        if step.action not in registry:
            known = ", ".join(registry.names())
            problems.append((f"steps.{number}.action", f"unknown action {step.action!r} ({known})"))
            continue
        action = registry.get(step.action)
        for problem in playbooks.validate_step_params(step, action.params_model, step.params):
            problems.append((problem["field"], problem["message"]))
        undo = step.undo_spec
        if undo is not None:
            undo_action = undo.action or step.action
            if undo_action not in registry:
                problems.append((f"steps.{number}.undo.action", f"unknown action {undo_action!r}"))
            elif undo.action is None and not registry.get(undo_action).supports_undo:
                problems.append((f"steps.{number}.undo", f"action {undo_action} has no undo"))
            else:
                model = registry.get(undo_action).params_model
                where = f"steps.{step.id}.undo.params"
                for problem in playbooks.exec_target_problems(where, model, undo.params):
                    problems.append((problem["field"], problem["message"]))
    return problems


def load_playbooks_strict(
    paths: Iterable[pathlib.Path], registry: actions.Registry
) -> list[playbooks.Playbook]:
    loaded, problems = load_playbooks(paths, registry)
    if problems:
        raise RulesInvalid(problems)
    return loaded


class TokensInvalid(ValueError):
    """A tokens file that cannot be used; the message names each problem and where it is
    (never a token's value)."""


def load_token_entries(path: pathlib.Path) -> list[auth.TokenEntry]:
    try:
        documents = safe_load_all(_read(path))
    except OSError as e:
        raise TokensInvalid(f"{path}: {e.strerror or e}") from None
    except (ValueError, yaml.YAMLError) as e:
        raise TokensInvalid(f"{path}: {e}") from None
    data = (documents[0] if documents else None) or []
    if not isinstance(data, list):
        raise TokensInvalid(f"{path}: expected a YAML list of tokens")
    try:
        return pydantic.TypeAdapter(list[auth.TokenEntry]).validate_python(data)
    except pydantic.ValidationError as e:
        problems = [
            f"{path}: entry {error['loc'][0]}"
            + "".join(f".{part}" for part in error["loc"][1:])
            + f": {error['msg']}"
            for error in e.errors(include_input=False, include_url=False)
        ]
        raise TokensInvalid("\n".join(problems)) from None


def load_tokens(path: pathlib.Path) -> auth.TokenBook:
    return auth.TokenBook(load_token_entries(path))
