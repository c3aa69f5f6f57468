"""The body each channel type expects, built from one rendered message. Pure functions.

- ``webhook``: ``{"message": ..., **data}`` (unchanged since the first release).
- ``slack``: an incoming-webhook message: ``text`` (the fallback notifications and old clients
  show) and ``blocks`` (header, the message, the facts, a button to the run page).
- ``msteams``: a message with one Adaptive Card attachment, the envelope Teams incoming
  webhooks and Power Automate workflows ("post to a channel when a webhook request is
  received") both accept; its text is plain text runs, never Markdown.
- ``pagerduty``: an Events API v2 event: ``trigger`` with summary, source, severity and custom
  details, or ``resolve``; ``dedup_key`` ties a resolve to the incident its trigger opened.
- ``alertmanager``: a list of one alert for ``POST /api/v2/alerts``; resolving posts the same
  labels with ``endsAt``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from remediator.domain import notices

#: alertname of the alerts posted back to Alertmanager (no playbook answers it, so remediator
#: never acts on its own notices when Alertmanager routes them back to it).
NOTICE_ALERTNAME = "RemediatorNotice"

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    text: str
    channel: str
    severity: notices.Severity
    resolve: bool
    dedup_key: str
    at: dt.datetime
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    run_id: int | None = None
    run_url: str | None = None
    playbook: str | None = None
    node: str | None = None
    gpu: str | None = None
    owner: str | None = None

    @property
    def title(self) -> str:
        what = self.labels.get("alertname") or self.playbook or "notice"
        where = f" on {self.node}" if self.node else ""
        gpu = f" GPU {self.gpu}" if self.gpu else ""
        head = "Resolved: " if self.resolve else ""
        return f"{head}remediator: {what}{where}{gpu}"

    def facts(self) -> list[tuple[str, str]]:
        found = [
            ("Run", f"{self.run_id}" if self.run_id is not None else ""),
            ("Playbook", self.playbook or ""),
            ("Node", self.node or ""),
            ("GPU", self.gpu or ""),
            ("Severity", self.severity),
            ("Alert", self.labels.get("alertname", "")),
            ("Namespace", str(self.data.get("namespace") or self.labels.get("namespace", ""))),
            ("Pod", str(self.data.get("pod") or "")),
            ("Owner", self.owner or ""),
        ]
        return [(name, value) for name, value in found if value]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def webhook(message: Message) -> dict[str, Any]:
    return {"message": message.text, **message.data}


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(message: Message) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(message.title, 150)}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _cut(_slack_escape(message.text), 3000)},
        },
    ]
    facts = message.facts()
    if facts:
        blocks.append(
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": _cut(f"*{name}*\n{_slack_escape(value)}", 2000)}
                    for name, value in facts[:10]
                ],
            }
        )
    if message.run_url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": f"Open run {message.run_id}"},
                        "url": message.run_url,
                        "action_id": "open-run",
                    }
                ],
            }
        )
    fallback = f"{message.title}: {message.text}"
    return {"text": _cut(_slack_escape(fallback), 3000), "blocks": blocks}


def _plain(text: str, **style: str) -> dict[str, Any]:
    """Text Teams shows as it is: a ``TextRun`` of a ``RichTextBlock``. A ``TextBlock`` and a
    ``FactSet`` read their text as Markdown, so an alert's label holding ``[Approve](url)``
    would show as a link the on-call engineer did not get from remediator."""
    return {"type": "RichTextBlock", "inlines": [{"type": "TextRun", "text": text, **style}]}


def _teams_fact(name: str, value: str) -> dict[str, Any]:
    return {
        "type": "ColumnSet",
        "spacing": "None",
        "columns": [
            {"type": "Column", "width": "90px", "items": [_plain(name, weight="Bolder")]},
            {"type": "Column", "width": "stretch", "items": [_plain(value)]},
        ],
    }


def msteams(message: Message) -> dict[str, Any]:
    """An Adaptive Card whose alert-borne text is plain (``_plain``), never Markdown."""
    colour = "Good" if message.resolve else _teams_colour(message.severity)
    body: list[dict[str, Any]] = [
        _plain(message.title, weight="Bolder", size="Medium", color=colour),
        _plain(message.text),
        *(_teams_fact(name, value) for name, value in message.facts()),
    ]
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if message.run_url:
        card["actions"] = [
            {
                "type": "Action.OpenUrl",
                "title": f"Open run {message.run_id}",
                "url": message.run_url,
            }
        ]
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


def _teams_colour(severity: notices.Severity) -> str:
    return {"critical": "Attention", "error": "Attention", "warning": "Warning"}.get(
        severity, "Default"
    )


def pagerduty(message: Message, *, routing_key: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "resolve" if message.resolve else "trigger",
        "dedup_key": message.dedup_key,
    }
    if message.resolve:
        return event
    details: dict[str, Any] = {
        "message": message.text,
        **{name.lower(): value for name, value in message.facts()},
        **{key: value for key, value in message.data.items() if key != "message"},
    }
    if message.labels:
        details["labels"] = dict(message.labels)
    event["payload"] = {
        "summary": _cut(message.text.replace("\n", " "), 1024),
        "source": message.node or "remediator",
        "severity": message.severity,
        "timestamp": message.at.isoformat(),
        "component": message.gpu or message.node or "remediator",
        "group": message.playbook or "remediator",
        "class": message.labels.get("alertname") or "remediator notice",
        "custom_details": details,
    }
    event["client"] = "remediator"
    if message.run_url:
        event["client_url"] = message.run_url
        event["links"] = [{"href": message.run_url, "text": f"remediator run {message.run_id}"}]
    return event


def alertmanager(message: Message) -> list[dict[str, Any]]:
    labels = {key: value for key, value in message.labels.items() if _LABEL_NAME.match(key)}
    if "alertname" in labels:
        labels["remediator_alertname"] = labels["alertname"]
    labels |= {"alertname": NOTICE_ALERTNAME, "severity": message.severity}
    labels["remediator_notice"] = message.dedup_key
    for key, value in (
        ("remediator_playbook", message.playbook),
        ("node", message.node),
        ("gpu", message.gpu),
        ("owner", message.owner),
    ):
        if value and not labels.get(key):
            labels[key] = value
    annotations = {"summary": _cut(message.text, 4096), "description": message.title}
    annotations |= {
        key: str(value)
        for key, value in message.data.items()
        if _LABEL_NAME.match(key) and key not in annotations
    }
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": message.at.isoformat(),
    }
    if message.resolve:
        alert["endsAt"] = message.at.isoformat()
    if message.run_url:
        alert["generatorURL"] = message.run_url
        annotations["runbook_url"] = message.run_url
    return [alert]
