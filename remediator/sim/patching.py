"""The three PATCH flavours: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge.

Strategic merge knows the list merge keys of the fields the simulator's objects use (from the
``patchMergeKey`` tags of k8s.io/api); every other list is atomic and replaced, as for
``spec.taints``. Directives handled: ``$patch: replace|delete|merge``, ``$retainKeys``,
``$setElementOrder/<list>`` (accepted, order ignored) and ``$deleteFromPrimitiveList/<list>``.
"""

from __future__ import annotations

from typing import Any

from remediator.sim import errors, values

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# list field name -> merge key (k8s.io/api patchMergeKey tags for the fields we serve)
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "tolerations": "",  # atomic in the API; listed to be explicit
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "finalizers": "",
}
PRIMITIVE_MERGE_LISTS = {"finalizers"}


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == MERGE:
        if not isinstance(patch, dict):
            raise errors.ApiError(400, "merge patch must be a JSON object")
        result = merge_patch(target, patch)
    elif ctype == JSON_PATCH:
        if not isinstance(patch, list):
            raise errors.ApiError(400, "json patch must be a JSON array of operations")
        result = json_patch(target, patch)
    elif ctype == STRATEGIC:
        if not isinstance(patch, dict):
            raise errors.ApiError(400, "strategic merge patch must be a JSON object")
        result = strategic_merge(target, patch)
    else:
        raise errors.ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types "
            f"include: {JSON_PATCH}, {MERGE}, {STRATEGIC}, {APPLY}",
        )
    if not isinstance(result, dict):
        raise errors.ApiError(422, "patch result must be an object", reason="Invalid")
    return result


# ---- RFC 7386 ---------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` merged with ``patch``, ``target`` left as it was. What the patch does not
    touch is shared with ``target``, not copied: whoever keeps the result copies it (the store
    does, on every write)."""
    if not isinstance(patch, dict):
        return values.clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- RFC 6902 ---------------------------------------------------------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise errors.ApiError(422, f"invalid JSON pointer {pointer!r}", reason="Invalid")
    return [_unescape(t) for t in pointer[1:].split("/")]


def _walk(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for token in tokens:
        if isinstance(cur, dict):
            if token not in cur:
                raise errors.ApiError(422, f"path element {token!r} not found", reason="Invalid")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, allow_end=False)]
        else:
            raise errors.ApiError(422, f"cannot traverse into {token!r}", reason="Invalid")
    return cur


def _index(seq: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(seq)
    try:
        idx = int(part)
    except ValueError as e:
        raise errors.ApiError(422, f"invalid array index {part!r}", reason="Invalid") from e
    limit = len(seq) if allow_end else len(seq) - 1
    if idx < 0 or idx > limit:
        raise errors.ApiError(422, f"array index {idx} out of bounds", reason="Invalid")
    return idx


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise errors.ApiError(422, "cannot add to a scalar", reason="Invalid")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise errors.ApiError(422, "cannot remove the document root", reason="Invalid")
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise errors.ApiError(
                422, f"unable to remove nonexistent key: {last}: missing value", reason="Invalid"
            )
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, allow_end=False))
    raise errors.ApiError(422, "cannot remove from a scalar", reason="Invalid")


def json_patch(target: dict[str, Any], ops: list[Any]) -> Any:
    doc: Any = values.clone(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise errors.ApiError(422, "invalid JSON patch operation", reason="Invalid")
        kind = op["op"]
        tokens = _split_pointer(op["path"])
        if kind == "add":
            doc = _add(doc, tokens, values.clone(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            _walk(doc, tokens)
            if tokens:
                _remove(doc, tokens)
            doc = _add(doc, tokens, values.clone(op.get("value")))
        elif kind in ("move", "copy"):
            source = _split_pointer(op["from"])
            value = values.clone(_walk(doc, source))
            if kind == "move":
                _remove(doc, source)
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _walk(doc, tokens) != op.get("value"):
                raise errors.ApiError(422, f"testing value {op['path']} failed", reason="Invalid")
        else:
            raise errors.ApiError(422, f"unknown JSON patch op {kind!r}", reason="Invalid")
    return doc


# ---- strategic merge --------------------------------------------------------------------


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return values.clone(patch)
    patch = dict(patch)
    directive = patch.pop("$patch", None)
    if directive == "replace":
        return _strip_directives(patch)
    if directive == "delete":
        return None
    patch.pop("$retainKeys", None)
    # shared with ``target`` where the patch does not touch it, as in ``merge_patch``
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key), value, key)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = _strip_directives(values.clone(value))
    return result


def _merge_list(existing: Any, patch: list[Any], field: str) -> list[Any]:
    current: list[Any] = list(existing) if isinstance(existing, list) else []
    merge_key = MERGE_KEYS[field]
    if field in PRIMITIVE_MERGE_LISTS:
        return current + [v for v in patch if v not in current]
    if not merge_key:
        return [_strip_directives(v) for v in patch]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [
            _strip_directives(i)
            for i in patch
            if not (isinstance(i, dict) and i.get("$patch") == "replace")
        ]
    for item in patch:
        if not isinstance(item, dict):
            continue
        key_value = item.get(merge_key)
        idx = next(
            (
                i
                for i, c in enumerate(current)
                if isinstance(c, dict) and c.get(merge_key) == key_value
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                current.pop(idx)
            continue
        if idx is None:
            current.append(_strip_directives(item))
        else:
            current[idx] = strategic_merge(current[idx], item)
    return current


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value
