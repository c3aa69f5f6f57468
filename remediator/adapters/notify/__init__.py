"""Notifications over HTTP (httpx), with transport retries (tenacity) inside the adapter only.

A channel has a type (``config.ChannelType``) deciding the body (``payloads``) and a URL. A
notice without a channel is routed (``domain.notices``): the owner of its workload, label
routes, the default channel. Connection errors, timeouts, 429 (honouring ``Retry-After``) and
5xx are retried a bounded number of times; any other 4xx is a permanent failure. What the
engine sees is ``errors.ActionFailed`` naming the channel and the reason, never an httpx
exception and never the channel's URL or keys: every message is scrubbed of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import tenacity

from remediator.adapters.notify import config, payloads
from remediator.domain import errors, notices, templating
from remediator.ports import notify as port

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("remediator.notify")

NotifyChannel = config.NotifyChannel

#: The console's page of one run (``adapters.http.pages``), below ``external_url``.
RUN_PAGE = "/runbooks/runs/{run_id}"


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    return min(float(value), 30.0) if value.isdigit() else None


def _wait(state: tenacity.RetryCallState) -> float:
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, _Retryable) and error.retry_after is not None:
        return error.retry_after
    return float(tenacity.wait_exponential(multiplier=0.2, max=5)(state))


def scrub(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "[secret]")
    return text


class WebhookNotifier:
    """Delivers notices to the configured channels (every type, despite the historic name)."""

    def __init__(
        self,
        channels: Mapping[str, Any],
        *,
        routing: notices.Routing | None = None,
        external_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        attempts: int = 4,
        on_secrets: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.channels: dict[str, config.NotifyChannel] = dict(channels)
        # Told every secret value before it is used (a file may have been rotated since
        # start-up), so the log redaction knows it before httpx logs the request line.
        self.on_secrets = on_secrets
        self.routing = routing or notices.Routing()
        self.external_url = external_url.rstrip("/") if external_url else None
        self._client = client
        self.attempts = attempts

    @property
    def client(self) -> httpx.AsyncClient:
        """Made for the first notice: httpx and a client (its TLS context, httpcore) hold
        ~10 MB that a server which sends no notification never needs."""
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient()
        return self._client

    async def send(
        self, *, channel: str, message: str, data: dict[str, Any], idempotency_key: str
    ) -> dict[str, Any]:
        run_id = data.get("run_id")
        return await self.deliver(
            port.Notice(
                channel=channel,
                message=message,
                data=data,
                idempotency_key=idempotency_key,
                run_id=run_id if isinstance(run_id, int) else None,
                playbook=_text(data.get("playbook")),
                node=_text(data.get("node")),
            )
        )

    def run_url(self, run_id: int | None) -> str | None:
        if run_id is None or self.external_url is None:
            return None
        return self.external_url + RUN_PAGE.format(run_id=run_id)

    def choose(self, notice: port.Notice) -> tuple[notices.Choice, notices.Owner | None]:
        owner = None
        if notice.workload is not None:
            owner = notices.find_owner(self.routing.owner.keys, notice.workload.owner_sources())
        labels = {**notice.labels, **_run_labels(notice)}
        choice = notices.choose_channel(
            self.routing, explicit=notice.channel, labels=labels, owner=owner
        )
        return choice, owner

    def route(self, notice: port.Notice) -> dict[str, Any]:
        choice, owner = self.choose(notice)
        channel = self.channels.get(choice.channel)
        found: dict[str, Any] = {
            "channel": choice.channel,
            "routed_by": choice.reason,
            "type": channel.type if channel else None,
        }
        if channel is None:
            found["reason"] = f"channel {choice.channel!r} is not configured; logged only"
        if owner is not None:
            found["owner"] = owner.value
        if notice.workload is not None and notice.workload.lookup_error:
            found["owner_lookup_error"] = notice.workload.lookup_error
        return found

    async def deliver(self, notice: port.Notice) -> dict[str, Any]:
        choice, owner = self.choose(notice)
        channel = choice.channel
        outcome: dict[str, Any] = {"channel": channel, "routed_by": choice.reason}
        if owner is not None:
            outcome["owner"] = owner.value
        if notice.workload is not None and notice.workload.lookup_error:
            outcome["owner_lookup_error"] = notice.workload.lookup_error
        config_ = self.channels.get(channel)
        if config_ is None:
            logger.info("notification (channel %s not configured): %s", channel, notice.message)
            return outcome | {
                "delivered": False,
                "message": notice.message,
                "reason": f"channel {channel!r} is not configured; logged only",
            }
        message = self._message(config_, notice, channel=channel, owner=owner)
        outcome |= {"type": config_.type, "message": message.text}
        if config_.type in ("pagerduty", "alertmanager"):
            outcome["dedup_key"] = message.dedup_key
        outcome["event"] = "resolve" if notice.resolve else "trigger"
        secrets = config_.secrets()
        if self.on_secrets is not None:
            self.on_secrets(secrets)
        try:
            url, body = self._request(config_, message)
            headers = {"Idempotency-Key": notice.idempotency_key, **dict(config_.headers)}
            status = await self._post(url, body, headers, float(config_.timeout))
        except _Retryable as e:
            raise errors.ActionFailed(
                f"notification to channel {channel} ({config_.type}) failed after "
                f"{self.attempts} attempts: {scrub(str(e), secrets)}",
                temporary=True,
                output=outcome,
            ) from None
        except errors.ActionFailed as e:
            raise errors.ActionFailed(
                f"notification to channel {channel} ({config_.type}): {scrub(str(e), secrets)}",
                output=outcome,
            ) from None
        except ValueError as e:  # a secret's file or variable is gone
            raise errors.ActionFailed(
                f"notification to channel {channel} ({config_.type}) cannot be sent: "
                f"{scrub(str(e), secrets)}",
                output=outcome,
            ) from None
        return outcome | {"delivered": True, "status": status}

    def _message(
        self,
        channel_config: config.NotifyChannel,
        notice: port.Notice,
        *,
        channel: str,
        owner: notices.Owner | None,
    ) -> payloads.Message:
        message = payloads.Message(
            text=notice.message,
            channel=channel,
            severity=notice.severity or notices.severity_of(notice.labels.get("severity")),
            resolve=notice.resolve,
            dedup_key=_dedup_key(notice),
            at=notice.at or dt.datetime.now(dt.UTC),
            data=notice.data,
            labels=notice.labels,
            run_id=notice.run_id,
            run_url=self.run_url(notice.run_id),
            playbook=notice.playbook,
            node=notice.node,
            gpu=notice.gpu,
            owner=owner.value if owner else None,
        )
        templates = channel_config.templates
        template = templates.get(notice.playbook or "") or templates.get("*")
        if not template:
            return message
        try:
            text = notices.render_template(template, _template_context(message, notice))
        except templating.TemplateError as e:
            raise errors.ActionFailed(
                f"channel {channel}: message template for playbook "
                f"{notice.playbook or '(none)'}: {e}"
            ) from None
        return dataclasses.replace(message, text=text)

    @staticmethod
    def _request(
        channel_config: config.NotifyChannel, message: payloads.Message
    ) -> tuple[str, Any]:
        url = channel_config.resolve_url()
        kind = channel_config.type
        if kind == "slack":
            return url, payloads.slack(message)
        if kind == "msteams":
            return url, payloads.msteams(message)
        if kind == "pagerduty":
            return url, payloads.pagerduty(
                message, routing_key=channel_config.resolve_routing_key()
            )
        if kind == "alertmanager":
            return url, payloads.alertmanager(message)
        return url, payloads.webhook(message)

    async def _post(self, url: str, body: Any, headers: dict[str, str], timeout: float) -> int:
        import httpx

        async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=_wait,
            retry=tenacity.retry_if_exception_type(_Retryable),
            reraise=True,
        ):
            with attempt:
                try:
                    response = await self.client.post(
                        url, json=body, headers=headers, timeout=timeout
                    )
                except httpx.TransportError as e:
                    raise _Retryable(f"{type(e).__name__}: {e}") from e
                if response.status_code == 429 or response.status_code >= 500:
                    raise _Retryable(f"HTTP {response.status_code}", _retry_after(response))
                if response.status_code >= 400:
                    raise errors.ActionFailed(
                        f"refused: HTTP {response.status_code} {response.text[:200]}"
                    )
                return response.status_code
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _dedup_key(notice: port.Notice) -> str:
    if notice.dedup_key:
        return notice.dedup_key
    if notice.run_id is not None:
        return f"remediator-run-{notice.run_id}"
    return f"remediator-{notice.idempotency_key}"


def _template_context(message: payloads.Message, notice: port.Notice) -> dict[str, dict[str, str]]:
    """What a channel's template may reference (``notices.TEMPLATE_NAMESPACES``)."""
    return {
        "labels": dict(notice.labels),
        "annotations": dict(notice.annotations),
        "data": {key: str(value) for key, value in notice.data.items()},
        "target": {"node": notice.node or "", "gpu": notice.gpu or ""},
        "run": {
            "id": "" if notice.run_id is None else str(notice.run_id),
            "playbook": notice.playbook or "",
            "url": message.run_url or "",
        },
        "notice": {
            "message": notice.message,
            "severity": message.severity,
            "channel": message.channel,
            "event": "resolve" if notice.resolve else "trigger",
            "owner": message.owner or "",
        },
    }


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _run_labels(notice: port.Notice) -> dict[str, str]:
    """What routes may match besides the alert's labels (the alert's own win)."""
    extra = {"playbook": notice.playbook, "node": notice.node, "gpu": notice.gpu}
    found = {key: value for key, value in extra.items() if value and not notice.labels.get(key)}
    if notice.workload is not None and not notice.labels.get("namespace"):
        found["namespace"] = notice.workload.namespace
    return found
