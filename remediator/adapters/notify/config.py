"""A notification channel's settings: its type, where it posts, its secrets and templates.

URLs of chat webhooks carry their token and a PagerDuty routing key opens incidents: both are
secrets. They come inline (kept as ``SecretStr``), from a file (a mounted Kubernetes Secret,
re-read at every send so a rotated secret is used without a restart) or from an environment
variable, and are never logged nor put into error messages.
"""

from __future__ import annotations

import os
import pathlib
from typing import ClassVar, Literal

import pydantic

from remediator.domain import notices, templating

ChannelType = Literal["webhook", "slack", "msteams", "pagerduty", "alertmanager"]

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
ALERTMANAGER_ALERTS_PATH = "/api/v2/alerts"


DOC_EXAMPLES = """\
One channel of each type (YAML config file):

```yaml
external_url: https://remediator.example.com   # links in messages open the run page
notify_channels:
  default:                      # today's JSON: {"message": ..., "run_id": ..., ...data}
    type: webhook
    url: https://hooks.internal.example.com/remediator
    headers: {Authorization: "Bearer ..."}
  gpu-chat:                     # Slack incoming webhook: blocks, fallback text, a run button
    type: slack
    url_file: /etc/remediator/secrets/slack-webhook-url
  ml-teams:                     # Teams incoming webhook or Power Automate workflow
    type: msteams
    url_env: TEAMS_ML_WEBHOOK_URL
    templates:
      gpu-utilization-low: >-
        {{ data.namespace }}/{{ data.pod }} holds GPU {{ target.gpu or "?" }} on
        {{ target.node }} and barely uses it. {{ run.url }}
  on-call:                      # PagerDuty Events API v2 (trigger, resolve by dedup_key)
    type: pagerduty
    routing_key_file: /etc/remediator/secrets/pagerduty-routing-key
  alertmanager:                 # an alert RemediatorNotice posted back to Alertmanager
    type: alertmanager          # url: its base URL; default: the alertmanager_url setting
```

A Slack or Teams URL carries its token and a routing key opens incidents: give them with
`url_file` / `routing_key_file` (a mounted Secret, re-read at every send) or `url_env` /
`routing_key_env`; inline values are accepted but kept out of logs and error messages like
the others. A channel that refuses a notice (4xx) fails the step; 5xx, 429 and connection
errors are retried (4 attempts, honouring Retry-After), then the step fails as temporary and
the engine retries it later. `pagerduty` and `alertmanager` notices share one dedup key per run
(`remediator-run-<id>`; a step's `dedup_key` overrides it), so a notify step with
`resolve: true`, or the undo of a notify step (`undo: true`, run on resolution), resolves the
incident or ends the alert. The alert posted to Alertmanager carries the alert's labels
(its alertname as `remediator_alertname`), the run's `node`, `gpu`, `remediator_playbook` and
`owner`, and the message as the `summary` annotation: routes on `namespace`, `team` or
`severity` apply as for any alert. No playbook answers `RemediatorNotice`.

From the environment, as JSON:
`REMEDIATOR_NOTIFY_CHANNELS='{"default": {"type": "slack", "url_env": "SLACK_URL"}}'`.
"""


SENSITIVE_HEADER_WORDS = ("authorization", "token", "key", "secret", "cookie", "signature")


class SecretUnavailable(ValueError):
    """A secret's file or environment variable cannot be read (the message names the source,
    never the value)."""


def _read_secret(
    inline: pydantic.SecretStr | None, file: pathlib.Path | None, env: str | None, *, what: str
) -> str | None:
    if inline is not None:
        return inline.get_secret_value().strip()
    if file is not None:
        try:
            return file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise SecretUnavailable(
                f"{what}_file {file} cannot be read ({type(e).__name__})"
            ) from None
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise SecretUnavailable(f"{what}_env: environment variable {env} is not set")
        return value
    return None


class NotifyChannel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    doc_examples: ClassVar[str] = DOC_EXAMPLES

    type: ChannelType = pydantic.Field(
        default="webhook",
        description="webhook (JSON `{message, ...data}`), slack (incoming webhook), msteams "
        "(Teams incoming webhook or workflow: an Adaptive Card), pagerduty (Events API v2) or "
        "alertmanager (an alert posted to its /api/v2/alerts, so its routing applies).",
    )
    url: pydantic.SecretStr | None = pydantic.Field(
        default=None,
        description="Where to post (a secret: chat webhook URLs carry their token). "
        "pagerduty: default the Events API v2; alertmanager: its base URL, default the "
        "`alertmanager_url` setting. Give at most one of url, url_file, url_env.",
    )
    url_file: pathlib.Path | None = pydantic.Field(
        default=None, description="File holding the URL (e.g. a mounted Secret)."
    )
    url_env: str | None = pydantic.Field(
        default=None, description="Environment variable holding the URL."
    )
    routing_key: pydantic.SecretStr | None = pydantic.Field(
        default=None,
        description="pagerduty only: the integration's routing key (or routing_key_file, "
        "routing_key_env; exactly one).",
    )
    routing_key_file: pathlib.Path | None = None
    routing_key_env: str | None = None
    headers: dict[str, str] = pydantic.Field(
        default_factory=dict, description="Extra headers, e.g. an Authorization header."
    )
    timeout: float = pydantic.Field(
        default=10.0, gt=0, le=120, description="Seconds per attempt (4 attempts at most)."
    )
    templates: dict[str, str] = pydantic.Field(
        default_factory=dict,
        description="Message templates by playbook name (`*`: any other playbook), in the "
        "playbooks' template syntax; may use labels.*, annotations.*, data.*, target.node, "
        "target.gpu, run.id, run.playbook, run.url, notice.message, notice.severity, "
        "notice.channel, notice.event, notice.owner.",
    )

    @pydantic.field_validator("templates")
    @classmethod
    def _templates_parse(cls, value: dict[str, str]) -> dict[str, str]:
        for playbook, text in value.items():
            try:
                notices.validate_template(text)
            except templating.TemplateError as e:
                raise ValueError(f"template for {playbook!r}: {e}") from None
        return value

    @pydantic.model_validator(mode="after")
    def _sources(self) -> NotifyChannel:
        urls = [self.url, self.url_file, self.url_env]
        keys = [self.routing_key, self.routing_key_file, self.routing_key_env]
        if sum(x is not None for x in urls) > 1:
            raise ValueError("give at most one of url, url_file, url_env")
        if not any(x is not None for x in urls) and self.type not in ("pagerduty", "alertmanager"):
            raise ValueError(f"a {self.type} channel needs url, url_file or url_env")
        if self.type == "pagerduty":
            if sum(x is not None for x in keys) != 1:
                raise ValueError(
                    "a pagerduty channel needs exactly one of routing_key, routing_key_file, "
                    "routing_key_env"
                )
        elif any(x is not None for x in keys):
            raise ValueError("routing_key is for pagerduty channels only")
        if self.url is not None:
            _check_url(self.url.get_secret_value())
        return self

    @property
    def has_url(self) -> bool:
        return any(x is not None for x in (self.url, self.url_file, self.url_env))

    def resolve_url(self) -> str:
        """The URL to post to now (``SecretUnavailable``/``ValueError`` if unusable)."""
        url = _read_secret(self.url, self.url_file, self.url_env, what="url")
        if url is None and self.type == "pagerduty":
            url = PAGERDUTY_EVENTS_URL
        if url is None:
            raise SecretUnavailable("no url configured")
        _check_url(url)
        if self.type == "alertmanager" and not url.rstrip("/").endswith(ALERTMANAGER_ALERTS_PATH):
            url = url.rstrip("/") + ALERTMANAGER_ALERTS_PATH
        return url

    def resolve_routing_key(self) -> str:
        key = _read_secret(
            self.routing_key, self.routing_key_file, self.routing_key_env, what="routing_key"
        )
        if not key:
            raise SecretUnavailable("no routing_key configured")
        return key

    def secrets(self) -> list[str]:
        """Values to scrub from any text that may reach a log or a step output."""
        found: list[str] = []
        sources = [self.resolve_url] if self.has_url else []
        if self.type == "pagerduty":
            sources.append(self.resolve_routing_key)
        for resolve in sources:
            try:
                found.append(resolve())
            except ValueError:
                continue
        found += [
            value
            for name, value in self.headers.items()
            if any(word in name.lower() for word in SENSITIVE_HEADER_WORDS)
        ]
        return [value for value in found if len(value) >= 4]

    def check_sources(self) -> None:
        """Read every configured secret once (at start-up) so a missing file fails early."""
        if self.has_url or self.type == "pagerduty":
            self.resolve_url()
        if self.type == "pagerduty":
            self.resolve_routing_key()


def _check_url(url: str) -> None:
    try:
        pydantic.TypeAdapter(pydantic.AnyHttpUrl).validate_python(url)
    except pydantic.ValidationError:
        raise ValueError("url is not an http(s) URL") from None
