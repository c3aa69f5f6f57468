"""Alertmanager-style label matchers and target extraction.

Matchers use Alertmanager's operators ``=``, ``!=``, ``=~``, ``!~``; regexes are anchored
(``^(?:re)$``) exactly as Alertmanager anchors them, and a missing label matches as the empty
string. Playbooks are indexed by alertname, so matching one alert costs one dictionary lookup
plus the matchers of the few playbooks written for that alert, however many playbooks exist.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic


class MatchOp(enum.StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


_MATCHER = re.compile(
    r'^\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^"]*?)\s*$'
)


class Matcher(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: str = pydantic.Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    op: MatchOp = MatchOp.EQ
    value: str

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            found = _MATCHER.match(data)
            if not found:
                raise ValueError(f'cannot parse matcher {data!r}; expected e.g. severity=~"crit.*"')
            value = found["value"]
            if value.startswith('"'):
                value = bytes(value[1:-1], "utf-8").decode("unicode_escape")
            return {"name": found["name"], "op": found["op"], "value": value}
        return data

    @pydantic.model_validator(mode="after")
    def _regex_compiles(self) -> Matcher:
        if self.op in (MatchOp.RE, MatchOp.NRE):
            try:
                re.compile(self.value)
            except re.error as e:
                raise ValueError(f"invalid regex {self.value!r}: {e}") from None
        return self

    @property
    def _pattern(self) -> re.Pattern[str]:
        return _compiled(self.value)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op is MatchOp.EQ:
            return actual == self.value
        if self.op is MatchOp.NE:
            return actual != self.value
        hit = self._pattern.fullmatch(actual) is not None
        return hit if self.op is MatchOp.RE else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op.value}"{self.value}"'


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(value: str) -> re.Pattern[str]:
    pattern = _PATTERNS.get(value)
    if pattern is None:
        pattern = _PATTERNS[value] = re.compile(f"^(?:{value})$")
    return pattern


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(matcher.matches(labels) for matcher in matchers)


DEFAULT_NODE_LABELS = ("node", "Hostname", "hostname", "kubernetes_node", "instance")
DEFAULT_GPU_LABELS = ("UUID", "pci_bus_id", "gpu")


def strip_port(value: str) -> str:
    """``gpu-node-01:9400`` → ``gpu-node-01``; ``[fe80::1]:9400`` → ``fe80::1``."""
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host
    return value


def first_label(labels: Mapping[str, str], keys: Iterable[str]) -> str | None:
    for key in keys:
        value = labels.get(key)
        if value:
            return strip_port(value) if key == "instance" else value
    return None
