"""Label and field selectors, parsed the way kube-apiserver parses them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from remediator.sim import errors

_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_OP_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*(\S*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclasses.dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text:
        return []
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
            continue
        if m := _OP_RE.match(part):
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
            continue
        if m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
            continue
        raise errors.ApiError(400, f"unable to parse requirement: {part.strip()!r}")
    return reqs


def matches_labels(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def selector_from_label_selector(selector: Mapping[str, Any] | None) -> list[Requirement] | None:
    """Convert a metav1.LabelSelector; ``None`` means "selects nothing" (nil selector)."""
    if selector is None:
        return None
    reqs = [Requirement(k, "=", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    op_map = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        reqs.append(
            Requirement(expr["key"], op_map[expr["operator"]], tuple(expr.get("values") or ()))
        )
    return reqs


# ---- field selectors -------------------------------------------------------------------


FieldGetter = Callable[[Mapping[str, Any]], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for key in keys:
            if not isinstance(cur, Mapping):
                return ""
            cur = cur.get(key)
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return str(cur)

    return get


_COMMON = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}


def _host_network(obj: Mapping[str, Any]) -> str:
    """kube-apiserver answers ``spec.hostNetwork`` as "true"/"false", unset being "false"."""
    return "true" if _path("spec", "hostNetwork")(obj) == "true" else "false"


FIELDS: dict[str, dict[str, FieldGetter]] = {
    "pods": {
        **_COMMON,
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": _host_network,
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "nodes": {**_COMMON, "spec.unschedulable": _path("spec", "unschedulable")},
    "events": {
        **_COMMON,
        "involvedObject.kind": _path("involvedObject", "kind"),
        "involvedObject.namespace": _path("involvedObject", "namespace"),
        "involvedObject.name": _path("involvedObject", "name"),
        "involvedObject.uid": _path("involvedObject", "uid"),
        "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
        "involvedObject.resourceVersion": _path("involvedObject", "resourceVersion"),
        "involvedObject.fieldPath": _path("involvedObject", "fieldPath"),
        "reason": _path("reason"),
        "reportingComponent": _path("reportingComponent"),
        "source": _path("source", "component"),
        "type": _path("type"),
    },
    "events.events.k8s.io": {
        **_COMMON,
        "regarding.kind": _path("regarding", "kind"),
        "regarding.namespace": _path("regarding", "namespace"),
        "regarding.name": _path("regarding", "name"),
        "regarding.uid": _path("regarding", "uid"),
        "reason": _path("reason"),
        "reportingController": _path("reportingController"),
        "type": _path("type"),
    },
}


@dataclasses.dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


def parse_field_selector(text: str | None, store_key: str) -> list[FieldRequirement]:
    if not text:
        return []
    allowed = FIELDS.get(store_key, _COMMON)
    reqs: list[FieldRequirement] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "!=" in part:
            field, value = part.split("!=", 1)
            equal = False
        elif "==" in part:
            field, value = part.split("==", 1)
            equal = True
        elif "=" in part:
            field, value = part.split("=", 1)
            equal = True
        else:
            raise errors.ApiError(400, f"invalid selector: '{text}'; can't understand '{part}'")
        field = field.strip()
        if field not in allowed:
            raise errors.ApiError(400, f'field label not supported: "{field}"')
        reqs.append(FieldRequirement(field, equal, value.strip()))
    return reqs


def matches_fields(reqs: list[FieldRequirement], obj: Mapping[str, Any], store_key: str) -> bool:
    allowed = FIELDS.get(store_key, _COMMON)
    for req in reqs:
        actual = allowed[req.field](obj)
        if (actual == req.value) != req.equal:
            return False
    return True
