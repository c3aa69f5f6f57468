"""Every channel type against a real recording HTTP server: the payload each service expects."""

from __future__ import annotations

import datetime as dt

import pytest

from remediator.adapters import notify
from remediator.domain import errors, notices
from remediator.ports import notify as port
from tests.support.notify import RecordingServer

AT = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
LABELS = {
    "alertname": "GPUUtilizationLow",
    "severity": "critical",
    "namespace": "research",
    "Hostname": "gpu-node-07",
}


@pytest.fixture
async def server(aiohttp_server) -> RecordingServer:
    return await RecordingServer().start(aiohttp_server)


def _notifier(channels, **kwargs) -> notify.WebhookNotifier:
    parsed = {name: notify.NotifyChannel.model_validate(c) for name, c in channels.items()}
    return notify.WebhookNotifier(
        parsed, external_url="https://remediator.example.test/", attempts=2, **kwargs
    )


def _notice(**overrides) -> port.Notice:
    fields = {
        "message": "Pod research/jupyter-alice holds GPU 3 but keeps it <30% busy.",
        "idempotency_key": "run-7-step-21",
        "data": {"namespace": "research", "pod": "jupyter-alice"},
        "labels": LABELS,
        "run_id": 7,
        "playbook": "gpu-utilization-low",
        "node": "gpu-node-07",
        "gpu": "3",
        "at": AT,
    }
    return port.Notice(**(fields | overrides))


RUN_URL = "https://remediator.example.test/runbooks/runs/7"


async def test_a_webhook_channel_posts_the_message_and_data_as_before(server):
    out = await _notifier({"ops": {"url": server.url("/hook")}}).deliver(_notice(channel="ops"))
    assert out["delivered"] is True
    [request] = server.requests
    assert request["headers"]["Idempotency-Key"] == "run-7-step-21"
    assert request["json"] == {
        "message": "Pod research/jupyter-alice holds GPU 3 but keeps it <30% busy.",
        "namespace": "research",
        "pod": "jupyter-alice",
    }


async def test_a_slack_channel_posts_blocks_with_fallback_text_and_a_run_button(server):
    channels = {"chat": {"type": "slack", "url": server.url("/services/T0/B0/xyz")}}
    await _notifier(channels).deliver(_notice(channel="chat"))
    [body] = server.bodies("/services/T0/B0/xyz")
    assert body["text"].startswith("remediator: GPUUtilizationLow on gpu-node-07 GPU 3: Pod")
    assert "&lt;30% busy" in body["text"]  # Slack's three escapes
    kinds = [block["type"] for block in body["blocks"]]
    assert kinds == ["header", "section", "section", "actions"]
    assert body["blocks"][0]["text"] == {
        "type": "plain_text",
        "text": "remediator: GPUUtilizationLow on gpu-node-07 GPU 3",
    }
    assert body["blocks"][1]["text"]["type"] == "mrkdwn"
    fields = [field["text"] for field in body["blocks"][2]["fields"]]
    assert "*Node*\ngpu-node-07" in fields
    assert "*Pod*\njupyter-alice" in fields
    assert len(fields) <= 10
    [button] = body["blocks"][3]["elements"]
    assert button["type"] == "button"
    assert button["url"] == RUN_URL
    assert button["text"] == {"type": "plain_text", "text": "Open run 7"}


async def test_a_teams_channel_posts_an_adaptive_card_in_the_message_envelope(server):
    channels = {"teams": {"type": "msteams", "url": server.url("/workflows/abc")}}
    await _notifier(channels).deliver(_notice(channel="teams"))
    [body] = server.bodies()
    assert body["type"] == "message"
    [attachment] = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["contentUrl"] is None
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    assert card["version"] == "1.4"
    title, text, *facts = card["body"]
    title_text = "remediator: GPUUtilizationLow on gpu-node-07 GPU 3"
    assert title == _plain(title_text, weight="Bolder", size="Medium", color="Attention")
    assert text == _plain(_notice().message)
    rows = {_cells(fact)[0]: _cells(fact)[1] for fact in facts}
    assert rows["Run"] == "7"
    assert rows["Pod"] == "jupyter-alice"
    assert card["actions"] == [{"type": "Action.OpenUrl", "title": "Open run 7", "url": RUN_URL}]


def _plain(text, **style):
    """What the card must hold ``text`` in: a text run, which Teams shows as plain text."""
    return {"type": "RichTextBlock", "inlines": [{"type": "TextRun", "text": text, **style}]}


def _cells(fact):
    assert fact["type"] == "ColumnSet"
    return [column["items"][0]["inlines"][0]["text"] for column in fact["columns"]]


def _walk(node):
    yield node
    for value in node.values() if isinstance(node, dict) else node:
        if isinstance(value, dict | list):
            yield from _walk(value)


async def test_a_teams_card_shows_alert_text_as_plain_text_never_markdown(server):
    """An alert's labels choose the alert name, namespace and pod the card shows: Markdown
    there (a link dressed as an approval) must reach the channel as the characters sent."""
    link = "[Approve the drain](https://evil.example/approve)"
    labels = LABELS | {"alertname": f"**{link}**", "namespace": link}
    channels = {"teams": {"type": "msteams", "url": server.url("/workflows/abc")}}
    notice = _notice(channel="teams", labels=labels, message=f"see {link}", data={"pod": link})
    await _notifier(channels).deliver(notice)
    [body] = server.bodies()
    card = body["attachments"][0]["content"]
    elements = [e for e in _walk(card["body"]) if isinstance(e, dict)]
    assert not [e for e in elements if e.get("type") in ("TextBlock", "FactSet", "Fact")]
    runs = [e["text"] for e in elements if e.get("type") == "TextRun"]
    assert sum(link in text for text in runs) == 5  # title, message, alert, namespace, pod
    assert all(e["type"] in ("RichTextBlock", "TextRun", "ColumnSet", "Column") for e in elements)


async def test_pagerduty_triggers_then_resolves_the_same_incident(server, monkeypatch):
    monkeypatch.setenv("PD_KEY", "R0UTINGKEY0123456789")
    channels = {
        "page": {"type": "pagerduty", "url": server.url("/v2/enqueue"), "routing_key_env": "PD_KEY"}
    }
    notifier = _notifier(channels)
    opened = await notifier.deliver(_notice(channel="page"))
    closed = await notifier.deliver(_notice(channel="page", resolve=True))
    trigger, resolve = server.bodies("/v2/enqueue")
    assert trigger["routing_key"] == "R0UTINGKEY0123456789"
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == "remediator-run-7" == opened["dedup_key"]
    payload = trigger["payload"]
    assert payload["summary"] == _notice().message
    assert payload["source"] == "gpu-node-07"
    assert payload["severity"] == "critical"  # from the alert's severity label
    assert payload["timestamp"] == AT.isoformat()
    assert payload["custom_details"]["pod"] == "jupyter-alice"
    assert payload["custom_details"]["labels"]["alertname"] == "GPUUtilizationLow"
    assert trigger["links"] == [{"href": RUN_URL, "text": "remediator run 7"}]
    assert resolve == {
        "routing_key": "R0UTINGKEY0123456789",
        "event_action": "resolve",
        "dedup_key": "remediator-run-7",
    }
    assert closed["event"] == "resolve"


async def test_pagerduty_severity_can_be_set_and_the_dedup_key_chosen(server, monkeypatch):
    monkeypatch.setenv("PD_KEY", "R0UTINGKEY0123456789")
    channels = {"page": {"type": "pagerduty", "url": server.url("/e"), "routing_key_env": "PD_KEY"}}
    await _notifier(channels).deliver(
        _notice(channel="page", severity="info", dedup_key="gpu-a1b2-episode")
    )
    [body] = server.bodies()
    assert body["payload"]["severity"] == "info"
    assert body["dedup_key"] == "gpu-a1b2-episode"


async def test_alertmanager_gets_an_alert_with_the_runs_labels_and_ends_it_on_resolve(server):
    channels = {"am": {"type": "alertmanager", "url": server.url("/")}}
    notifier = _notifier(channels)
    await notifier.deliver(_notice(channel="am"))
    await notifier.deliver(_notice(channel="am", resolve=True))
    fired, ended = server.bodies("/api/v2/alerts")
    [alert] = fired
    assert alert["labels"] == {
        "alertname": "RemediatorNotice",
        "remediator_alertname": "GPUUtilizationLow",
        "severity": "critical",
        "namespace": "research",
        "Hostname": "gpu-node-07",
        "remediator_notice": "remediator-run-7",
        "remediator_playbook": "gpu-utilization-low",
        "node": "gpu-node-07",
        "gpu": "3",
    }
    assert alert["annotations"]["summary"] == _notice().message
    assert alert["annotations"]["pod"] == "jupyter-alice"
    assert alert["generatorURL"] == RUN_URL
    assert alert["startsAt"] == AT.isoformat()
    assert "endsAt" not in alert  # Alertmanager's resolve_timeout applies
    [resolved] = ended
    assert resolved["labels"] == alert["labels"]  # the same alert
    assert resolved["endsAt"] == AT.isoformat()


async def test_a_channel_template_for_the_playbook_shapes_the_message(server):
    channels = {
        "ops": {
            "url": server.url("/hook"),
            "templates": {
                "gpu-utilization-low": "[{{ labels.namespace }}] {{ notice.message }} "
                '({{ data.pod }}, see {{ run.url }}; {{ labels.team or "no team" }})',
                "*": "other: {{ notice.message }}",
            },
        }
    }
    notifier = _notifier(channels)
    out = await notifier.deliver(_notice(channel="ops"))
    await notifier.deliver(_notice(channel="ops", playbook="gpu-xid-error", message="xid"))
    first, second = server.bodies()
    assert first["message"] == (
        f"[research] {_notice().message} (jupyter-alice, see {RUN_URL}; no team)"
    )
    assert out["message"] == first["message"]
    assert second["message"] == "other: xid"


async def test_a_template_missing_a_value_fails_the_step_clearly(server):
    channels = {"ops": {"url": server.url("/hook"), "templates": {"*": "{{ labels.team }}"}}}
    with pytest.raises(errors.ActionFailed, match=r"channel ops: message template .*labels.team"):
        await _notifier(channels).deliver(_notice(channel="ops"))
    assert server.requests == []


async def test_a_failing_channel_fails_with_its_name_and_never_its_url(server):
    secret_path = "/services/T0/B0/s3cr3t-t0ken"
    server.statuses = [502, 503]
    channels = {"chat": {"type": "slack", "url": server.url(secret_path)}}
    with pytest.raises(errors.ActionFailed) as info:
        await _notifier(channels).deliver(_notice(channel="chat"))
    assert info.value.temporary
    assert "channel chat (slack) failed after 2 attempts: HTTP 503" in str(info.value)
    assert "s3cr3t" not in str(info.value)
    assert len(server.requests) == 2


async def test_a_refused_notice_is_permanent_and_scrubbed_of_secrets(server, monkeypatch):
    monkeypatch.setenv("PD_KEY", "R0UTINGKEY0123456789")
    server.statuses = [400]
    channels = {"page": {"type": "pagerduty", "url": server.url("/e"), "routing_key_env": "PD_KEY"}}
    with pytest.raises(errors.ActionFailed) as info:
        await _notifier(channels).deliver(_notice(channel="page"))
    assert not info.value.temporary
    assert "channel page (pagerduty): refused: HTTP 400" in str(info.value)
    assert "R0UTINGKEY" not in str(info.value)


async def test_an_unreachable_channel_names_the_error_not_the_url(unused_tcp_port):
    url = f"http://127.0.0.1:{unused_tcp_port}/hooks/s3cr3t-t0ken"
    with pytest.raises(errors.ActionFailed) as info:
        await _notifier({"ops": {"url": url}}).deliver(_notice(channel="ops"))
    assert info.value.temporary
    assert "ConnectError" in str(info.value)
    assert "s3cr3t" not in str(info.value)


async def test_a_url_file_is_read_at_each_send(server, tmp_path):
    path = tmp_path / "url"
    path.write_text(server.url("/first") + "\n")
    notifier = _notifier({"ops": {"url_file": str(path)}})
    await notifier.deliver(_notice(channel="ops"))
    path.write_text(server.url("/rotated"))
    await notifier.deliver(_notice(channel="ops"))
    assert [r["path"] for r in server.requests] == ["/first", "/rotated"]
    path.unlink()
    with pytest.raises(errors.ActionFailed, match=r"url_file .* cannot be read"):
        await notifier.deliver(_notice(channel="ops"))


async def test_a_notice_without_a_channel_goes_where_the_routing_says(server):
    routing = notices.Routing.model_validate(
        {
            "routes": [{"matchers": ['namespace="research"'], "channel": "research"}],
            "owner": {"channels": {"ml-platform": "platform"}},
        }
    )
    channels = {
        name: {"url": server.url(f"/{name}")} for name in ("default", "research", "platform")
    }
    notifier = _notifier(channels, routing=routing)
    routed = await notifier.deliver(_notice())
    owned = await notifier.deliver(
        _notice(
            workload=port.Workload(
                namespace="research", pod="jupyter-alice", pod_labels={"team": "ml-platform"}
            )
        )
    )
    other = await notifier.deliver(_notice(labels={"alertname": "X"}, data={}))
    assert [r["path"] for r in server.requests] == ["/research", "/platform", "/default"]
    assert routed["routed_by"] == 'route 1 (namespace="research")'
    assert owned["routed_by"] == "owner ml-platform (pod label team)"
    assert owned["owner"] == "ml-platform"
    assert other["routed_by"] == "default channel"


async def test_legacy_sends_to_a_named_channel_link_the_run_when_they_name_it(server):
    channels = {"chat": {"type": "slack", "url": server.url("/s")}}
    await _notifier(channels).send(
        channel="chat", message="breaker opened", data={"run_id": 9}, idempotency_key="k"
    )
    [body] = server.bodies()
    assert body["blocks"][-1]["elements"][0]["url"].endswith("/runbooks/runs/9")


async def test_secrets_are_told_to_the_log_redaction_before_each_send(server, tmp_path):
    told: list[str] = []
    path = tmp_path / "url"
    path.write_text(server.url("/hooks/s3cr3t-1"))
    channel = notify.NotifyChannel.model_validate(
        {
            "url_file": str(path),
            "headers": {"Authorization": "Bearer abcdefgh", "X-Environment": "production"},
        }
    )
    notifier = notify.WebhookNotifier({"ops": channel}, on_secrets=told.extend)
    await notifier.deliver(_notice(channel="ops"))
    path.write_text(server.url("/hooks/s3cr3t-2"))  # rotated
    await notifier.deliver(_notice(channel="ops"))
    assert server.url("/hooks/s3cr3t-1") in told
    assert server.url("/hooks/s3cr3t-2") in told
    assert "Bearer abcdefgh" in told
    assert "production" not in told  # an ordinary header is no secret


def test_the_public_pagerduty_endpoint_is_no_secret_but_the_routing_key_is():
    channel = notify.NotifyChannel.model_validate(
        {"type": "pagerduty", "routing_key": "R0UTINGKEY0123456789"}
    )
    assert channel.resolve_url() == "https://events.pagerduty.com/v2/enqueue"
    assert channel.secrets() == ["R0UTINGKEY0123456789"]
