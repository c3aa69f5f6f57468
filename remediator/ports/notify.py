"""Outbound notifications (webhooks, chat, paging), implemented by an adapter over httpx.

``send`` is a plain message to a named channel. ``deliver`` takes a ``Notice``: it may leave
the channel to the configured routing (labels, the owner of a workload), carries what chat
cards and incidents show (run, node, severity, a link to the run page), and may resolve what
an earlier notice with the same ``dedup_key`` opened (a PagerDuty incident, an Alertmanager
alert).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any, Protocol

from remediator.domain import notices


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """The pod or namespace a notice is about, with the metadata its owner is read from."""

    namespace: str
    pod: str | None = None
    pod_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pod_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    namespace_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    namespace_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    lookup_error: str = ""
    """Why the metadata could not be read (the notice is then routed without an owner)."""

    def owner_sources(self) -> list[tuple[str, Mapping[str, str]]]:
        return [
            ("pod label", self.pod_labels),
            ("pod annotation", self.pod_annotations),
            ("namespace label", self.namespace_labels),
            ("namespace annotation", self.namespace_annotations),
        ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice:
    message: str
    idempotency_key: str
    """Stable across retries of one step (sent as ``Idempotency-Key``)."""
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    channel: str | None = None
    """A configured channel, or ``None`` for the routing to choose."""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The alert's labels (routing; the labels of an alert posted back to Alertmanager)."""
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    run_id: int | None = None
    playbook: str | None = None
    node: str | None = None
    gpu: str | None = None
    severity: notices.Severity | None = None
    """Default: from the alert's ``severity`` label."""
    resolve: bool = False
    dedup_key: str | None = None
    """Ties a resolve to what it closes; default: one per run."""
    workload: Workload | None = None
    at: dt.datetime | None = None


class Notifier(Protocol):
    async def send(
        self, *, channel: str, message: str, data: dict[str, Any], idempotency_key: str
    ) -> dict[str, Any]:
        """Deliver one notification; return what was delivered (for the step output)."""

    async def deliver(self, notice: Notice) -> dict[str, Any]:
        """Route and deliver a notice; return what was delivered (for the step output).
        Raises ``errors.ActionFailed`` when the channel refuses it or cannot be reached."""

    def route(self, notice: Notice) -> dict[str, Any]:
        """Where ``deliver`` would send the notice and why, sending nothing (for plans)."""
