"""Kubernetes JSON (as kubernetes_asyncio serialises it) into the port's plain records."""

from __future__ import annotations

import datetime as dt
import functools
import sys
from typing import Any

from remediator.ports import cluster as port

Obj = dict[str, Any]
VOLUME_SOURCES = ("name",)


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, dict) else {}


def _time(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _shared(value: Any) -> str:
    """One string object for every equal string (``sys.intern``; it lets go of a string no
    one holds any more)."""
    return sys.intern(str(value))


def _strings(mapping: Any) -> dict[str, str]:
    """A node's labels or annotations, their keys and values shared with every other node's:
    the cache holds every GPU node, and JSON parsing makes a new string of each value of each
    node (``"true"``, ``"amd64"``, the GPU product), a third of a cached node's memory."""
    if not isinstance(mapping, dict):
        return {}
    return {_shared(key): _shared(value) for key, value in mapping.items()}


def node(obj: Obj) -> port.NodeInfo:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    return port.NodeInfo(
        name=_shared(meta.get("name", "")),
        uid=str(meta.get("uid") or ""),
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        taints=[taint(t) for t in spec.get("taints") or []],
        unschedulable=bool(spec.get("unschedulable")),
        resource_version=str(meta.get("resourceVersion") or ""),
        ready=_node_ready(obj),
        boot_id=str(((obj.get("status") or {}).get("nodeInfo") or {}).get("bootID") or ""),
    )


def _node_ready(obj: Obj) -> bool | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return {"True": True, "False": False}.get(str(condition.get("status")))
    return None


def taint(obj: Obj) -> port.Taint:
    value = obj.get("value")
    return _taint(
        str(obj.get("key", "")),
        str(obj.get("effect", "")),
        None if value in (None, "") else str(value),
    )


@functools.lru_cache(maxsize=1024)
def _taint(key: str, effect: str, value: str | None) -> port.Taint:
    """One ``Taint`` (it is frozen) for every equal taint: a GPU fleet's nodes carry the same
    few, and a 5,800-node cache held 12,786 of them (0.7 MB)."""
    return port.Taint(
        key=_shared(key), effect=_shared(effect), value=_shared(value) if value else None
    )


def pod(obj: Obj) -> port.PodInfo:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    owners = [
        port.OwnerRef(
            kind=str(o.get("kind", "")),
            name=str(o.get("name", "")),
            uid=str(o.get("uid") or ""),
            controller=bool(o.get("controller")),
        )
        for o in meta.get("ownerReferences") or []
    ]
    volume_kinds = []
    for volume in spec.get("volumes") or []:
        kinds = [k for k, v in volume.items() if k not in VOLUME_SOURCES and v is not None]
        volume_kinds.append(kinds[0] if kinds else "unknown")
    grace = spec.get("terminationGracePeriodSeconds")
    return port.PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid") or ""),
        node_name=spec.get("nodeName") or None,
        phase=str(status.get("phase") or "Unknown"),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        owners=owners,
        volume_kinds=volume_kinds,
        containers=[str(c.get("name", "")) for c in spec.get("containers") or []],
        termination_grace_period_seconds=int(grace) if grace is not None else None,
        deletion_timestamp=_time(meta.get("deletionTimestamp")),
        resource_version=str(meta.get("resourceVersion") or ""),
        ready=any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ),
        gpu_requests=sum(_gpus(c) for c in spec.get("containers") or []),
        waiting=_waiting(status),
        terminated=_terminated(status),
    )


def _terminated(status: Obj) -> list[str]:
    out = []
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated")
        if isinstance(ended, dict):
            text = (
                f"{container.get('name', '')}: {ended.get('reason') or 'Terminated'} "
                f"(exit {ended.get('exitCode')})"
            )
            if ended.get("message"):
                text += f": {str(ended['message']).strip()[-300:]}"
            out.append(text)
    if not out and status.get("reason"):
        out.append(f"{status['reason']}: {str(status.get('message') or '')[:300]}")
    return out


def _waiting(status: Obj) -> list[str]:
    out = []
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if isinstance(waiting, dict):
            text = f"{container.get('name', '')}: {waiting.get('reason') or 'Waiting'}"
            if waiting.get("message"):
                text += f": {str(waiting['message'])[:200]}"
            out.append(text)
    return out


def _gpus(container: Obj) -> int:
    """``nvidia.com/gpu`` of a container: extended resources are set as limits (requests, if
    given, must equal them)."""
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        value = (resources.get(key) or {}).get("nvidia.com/gpu")
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def namespace(obj: Obj) -> port.NamespaceInfo:
    meta = _meta(obj)
    return port.NamespaceInfo(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
    )


def pdb(obj: Obj) -> port.PdbInfo:
    meta = _meta(obj)
    selector = (obj.get("spec") or {}).get("selector") or {}
    status = obj.get("status") or {}

    def number(key: str) -> int | None:
        value = status.get(key)
        return int(value) if value is not None else None

    return port.PdbInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        match_labels=dict(selector.get("matchLabels") or {}),
        match_expressions=list(selector.get("matchExpressions") or []),
        disruptions_allowed=number("disruptionsAllowed"),
        current_healthy=number("currentHealthy"),
        desired_healthy=number("desiredHealthy"),
        expected_pods=number("expectedPods"),
    )
