"""Server-side printing: ``meta.k8s.io`` Tables for ``kubectl get`` without ``-o``."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from aiohttp import web

from remediator.sim import resources, store

Obj = dict[str, Any]
Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell


def requested_version(request: web.Request) -> str | None:
    """The Table version kubectl asked for in ``Accept``, or None for plain objects."""
    for part in request.headers.get("Accept", "").split(","):
        params = dict(p.strip().split("=", 1) for p in part.split(";")[1:] if "=" in p)
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return f"meta.k8s.io/{params.get('v', 'v1')}"
    return None


def human_duration(seconds: float) -> str:
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


def _since(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    try:
        moment = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((store.utcnow() - moment).total_seconds())


def _age(obj: Obj) -> str:
    return _since(obj["metadata"].get("creationTimestamp"))


def _last_seen(event: Obj) -> str:
    series = event.get("series") or {}
    stamp = (
        series.get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or event["metadata"].get("creationTimestamp")
    )
    return _since(stamp)


def _involved(event: Obj) -> str:
    ref = event.get("involvedObject") or event.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _node_status(node: Obj) -> str:
    ready = next(
        (c for c in node.get("status", {}).get("conditions", []) if c.get("type") == "Ready"),
        None,
    )
    status = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    return status + (",SchedulingDisabled" if node["spec"].get("unschedulable") else "")


def _roles(node: Obj) -> str:
    prefix = "node-role.kubernetes.io/"
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k[len(prefix) :] for k in labels if k.startswith(prefix))
    return ",".join(roles) or "<none>"


def _pod_status(pod: Obj) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return str(pod.get("status", {}).get("phase", "Unknown"))


def _ready(pod: Obj) -> str:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    total = len(pod["spec"].get("containers", []))
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _restarts(pod: Obj) -> int:
    return sum(
        s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses") or []
    )


def _or_none(value: Any) -> Any:
    return "<none>" if value in (None, "") else value


NAME: Column = ("Name", "string", 0, lambda o: o["metadata"]["name"])
AGE: Column = ("Age", "string", 0, _age)
COLUMNS: dict[str, list[Column]] = {
    "nodes": [
        NAME,
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _roles),
        AGE,
        ("Version", "string", 0, lambda n: n["status"].get("nodeInfo", {}).get("kubeletVersion")),
        ("Internal-IP", "string", 1, lambda n: n["status"]["addresses"][0]["address"]),
    ],
    "pods": [
        NAME,
        ("Ready", "string", 0, _ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "integer", 0, _restarts),
        AGE,
        ("IP", "string", 1, lambda p: _or_none(p.get("status", {}).get("podIP"))),
        ("Node", "string", 1, lambda p: _or_none(p["spec"].get("nodeName"))),
        ("Nominated Node", "string", 1, lambda p: "<none>"),
        ("Readiness Gates", "string", 1, lambda p: "<none>"),
    ],
    "events": [
        ("Last Seen", "string", 0, _last_seen),
        ("Type", "string", 0, lambda e: e.get("type", "")),
        ("Reason", "string", 0, lambda e: e.get("reason", "")),
        ("Object", "string", 0, _involved),
        ("Message", "string", 0, lambda e: e.get("message") or e.get("note") or ""),
    ],
    "poddisruptionbudgets.policy": [
        NAME,
        ("Min Available", "string", 0, lambda p: p["spec"].get("minAvailable", "N/A")),
        ("Max Unavailable", "string", 0, lambda p: p["spec"].get("maxUnavailable", "N/A")),
        (
            "Allowed Disruptions",
            "integer",
            0,
            lambda p: p.get("status", {}).get("disruptionsAllowed", 0),
        ),
        AGE,
    ],
}


def table(version: str, res: resources.Resource, items: list[Obj], meta: Obj, include: str) -> Obj:
    columns = COLUMNS.get(res.store_key, [NAME, AGE])
    rows = []
    for obj in items:
        row: Obj = {"cells": [cell(obj) for _, _, _, cell in columns]}
        if include == "Object":
            row["object"] = {**obj, "kind": res.kind, "apiVersion": res.api_version}
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": version,
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": version,
        "metadata": meta,
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": priority,
            }
            for name, kind, priority, _ in columns
        ],
        "rows": rows,
    }
