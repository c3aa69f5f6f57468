"""Alertmanager v4 webhook bodies with one alert, for tests that need a specific alert."""

from __future__ import annotations

import json


def alert_body(
    *,
    alertname: str = "GPUXidError79",
    node: str = "gpu-node-03",
    status: str = "firing",
    starts: str = "2026-11-30T00:02:27.47Z",
    gpu: str | None = None,
    fingerprint: str | None = None,
    extra_labels: dict[str, str] | None = None,
) -> bytes:
    labels = {"alertname": alertname, "node": node, "severity": "critical"}
    if gpu is not None:
        labels["UUID"] = gpu
    labels |= extra_labels or {}
    alert = {
        "status": status,
        "labels": labels,
        "annotations": {"summary": f"{alertname} on {node}"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T00:05:00Z",
        "generatorURL": "http://prometheus.example:9090/graph?g0.expr=DCGM",
        "fingerprint": fingerprint or f"{abs(hash((alertname, node))) % 16**16:016x}",
    }
    return json.dumps(
        {
            "version": "4",
            "status": status,
            "receiver": "remediator",
            "alerts": [alert],
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager.example:9093",
            "groupKey": "g",
            "truncatedAlerts": 0,
        }
    ).encode()
