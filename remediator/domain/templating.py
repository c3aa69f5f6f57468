"""A deliberately small template syntax for playbook params.

Params may reference alert data only through ``{{ ... }}`` expressions of the form
``namespace.key`` with an optional fallback chain: ``{{ labels.pod or labels.exported_pod }}``,
``{{ labels.gpu or "all" }}``. There is no evaluation, no filters, no attribute access beyond
one level and no way to reach Python objects: a template is parsed into references when the
playbook is loaded (so a typo is a lint error) and rendered by dictionary lookups. Rendered
values are plain strings and are validated afterwards by the action's own params model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

NAMESPACES: dict[str, frozenset[str] | None] = {
    "labels": None,  # any label name
    "annotations": None,
    "params": None,  # a manual run's parameters
    "target": frozenset({"node", "gpu"}),
    "alert": frozenset({"alertname", "fingerprint", "status", "startsAt", "generatorURL"}),
    "run": frozenset({"playbook"}),
}

_EXPR = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_REF = re.compile(r"^(?P<ns>[a-z]+)\.(?P<key>[A-Za-z_][A-Za-z0-9_]*)$")
_LITERAL = re.compile(r'^"(?P<text>[^"\\]*)"$')


class TemplateError(ValueError):
    pass


class MissingValue(TemplateError):
    """A reference had no value and no fallback."""


Namespaces = Mapping[str, frozenset[str] | None]


def _parse_alternatives(
    expr: str, namespaces: Namespaces = NAMESPACES
) -> list[tuple[str, str] | str]:
    """``labels.pod or "x"`` → ``[("labels", "pod"), "x"]`` (a str is a literal)."""
    parts = [part.strip() for part in re.split(r"\s+or\s+", expr.strip())]
    alternatives: list[tuple[str, str] | str] = []
    for part in parts:
        literal = _LITERAL.fullmatch(part)
        if literal:
            alternatives.append(literal["text"])
            continue
        ref = _REF.fullmatch(part)
        if not ref:
            raise TemplateError(f"cannot parse {part!r}: expected namespace.key or a quoted string")
        namespace, key = ref["ns"], ref["key"]
        if namespace not in namespaces:
            raise TemplateError(f"unknown namespace {namespace!r}; use one of {sorted(namespaces)}")
        allowed = namespaces[namespace]
        if allowed is not None and key not in allowed:
            raise TemplateError(f"unknown key {namespace}.{key}; use one of {sorted(allowed)}")
        alternatives.append((namespace, key))
    return alternatives


def validate(text: str, *, namespaces: Namespaces = NAMESPACES) -> None:
    """Raise ``TemplateError`` if ``text`` holds a malformed expression."""
    if "{{" not in text and "}}" not in text:
        return
    stripped = _EXPR.sub("", text)
    if "{{" in stripped or "}}" in stripped:
        raise TemplateError("unbalanced '{{' or '}}'")
    for found in _EXPR.finditer(text):
        _parse_alternatives(found[1], namespaces)


def is_template(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def render(
    text: str,
    context: Mapping[str, Mapping[str, str]],
    *,
    namespaces: Namespaces = NAMESPACES,
) -> str:
    def substitute(found: re.Match[str]) -> str:
        for alternative in _parse_alternatives(found[1], namespaces):
            if isinstance(alternative, str):
                return alternative
            value = context.get(alternative[0], {}).get(alternative[1])
            if value is not None and value != "":
                return value
        raise MissingValue(f"no value for {found[1].strip()!r}")

    return _EXPR.sub(substitute, text)


def render_params(params: Any, context: Mapping[str, Mapping[str, str]]) -> Any:
    """Render every string in a nested params structure."""
    if isinstance(params, str):
        return render(params, context) if is_template(params) else params
    if isinstance(params, Mapping):
        return {key: render_params(value, context) for key, value in params.items()}
    if isinstance(params, list):
        return [render_params(value, context) for value in params]
    return params


def templated_paths(params: Any, prefix: tuple[str | int, ...] = ()) -> set[tuple[str | int, ...]]:
    """Locations of templated strings, so load-time validation can defer exactly those."""
    if is_template(params):
        return {prefix}
    found: set[tuple[str | int, ...]] = set()
    if isinstance(params, Mapping):
        for key, value in params.items():
            found |= templated_paths(value, (*prefix, key))
    elif isinstance(params, list):
        for index, value in enumerate(params):
            found |= templated_paths(value, (*prefix, index))
    return found


def validate_all(params: Any) -> None:
    if isinstance(params, str):
        validate(params)
    elif isinstance(params, Mapping):
        for value in params.values():
            validate_all(value)
    elif isinstance(params, list):
        for value in params:
            validate_all(value)
