"""Settings: defaults < config file (YAML, ``--config``) < ``REMEDIATOR_*`` environment < CLI.

Every field is documented here; ``docs/configuration.md`` is generated from this model.
"""

from __future__ import annotations

import contextvars
import pathlib
import re
from typing import Any, Literal

import pydantic
import pydantic_settings

from remediator.actions import driver as driver_action
from remediator.actions import hostexec
from remediator.actions import reboot as reboot_action
from remediator.adapters import kubernetes as kube_adapter
from remediator.adapters.notify import config as notify_config
from remediator.domain import guards as guards_mod
from remediator.domain import notices, targeting

_CONFIG_FILE: contextvars.ContextVar[pathlib.Path | None] = contextvars.ContextVar(
    "config_file", default=None
)


NotifyChannel = notify_config.NotifyChannel


class Settings(pydantic_settings.BaseSettings):
    model_config = pydantic_settings.SettingsConfigDict(
        env_prefix="REMEDIATOR_",
        extra="forbid",
        env_nested_delimiter="__",
        hide_input_in_errors=True,  # a rejected value may be a secret (a webhook URL, a key)
    )

    listen: str = pydantic.Field(
        default="127.0.0.1:8080", description="Address the HTTP server listens on (host:port)."
    )
    database_url: str = pydantic.Field(
        default="sqlite+aiosqlite:///remediator.db",
        description="SQLAlchemy URL: sqlite+aiosqlite:///file.db or postgresql+asyncpg://...",
    )
    database_timeout: float = pydantic.Field(
        default=30.0,
        gt=0,
        description="Seconds to wait for a database lock or connection before answering 503.",
    )
    rules: pathlib.Path = pydantic.Field(
        default=pathlib.Path("rules"), description="Directory of playbook YAML files."
    )
    tokens: pathlib.Path | None = pydantic.Field(
        default=None,
        description="Tokens file (YAML list of {name, token_sha256|token, roles}). Without "
        "one, remediator only listens on loopback and treats every caller as admin.",
    )
    max_body_bytes: int = pydantic.Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest accepted webhook (and plan) body (413 above); forms and the "
        "other JSON bodies take at most 64 KiB.",
    )
    body_read_timeout: float = pydantic.Field(
        default=30.0,
        gt=0,
        description="Seconds a client has to send a request body once its headers arrived "
        "(408 after, and the connection is closed).",
    )
    external_url: pydantic.AnyHttpUrl | None = pydantic.Field(
        default=None,
        description="The URL browsers reach remediator at, e.g. behind a reverse proxy that "
        "rewrites the Host header. Requests that change something are refused (403) when their "
        "Origin is neither this URL's origin nor the Host they were sent to.",
    )
    retry_after_seconds: int = pydantic.Field(
        default=5, ge=1, description="Retry-After sent with 503 when the store is unavailable."
    )
    migrate_on_start: bool | None = pydantic.Field(
        default=None,
        description="Run migrations at start-up. Default: yes on SQLite, no on Postgres (run "
        "`remediator migrate` once per upgrade instead).",
    )
    poll_interval: float = pydantic.Field(
        default=1.0, gt=0, description="Seconds between engine passes when idle."
    )
    lease_seconds: float = pydantic.Field(
        default=30.0, gt=0, description="Lease on a running step; renewed every third of it."
    )
    max_concurrent_steps: int = pydantic.Field(
        default=64,
        ge=1,
        le=1000,
        description="Steps this replica runs at the same time (they mostly wait on the "
        "cluster: a few long drains must not hold a storm's cordons back).",
    )
    shutdown_grace: float = pydantic.Field(
        default=20.0, ge=0, description="Seconds in-flight steps get to finish on SIGTERM."
    )
    dry_run: bool = pydantic.Field(
        default=False, description="Global dry-run: plan and record, touch nothing."
    )
    delivery_retention_days: int = pydantic.Field(
        default=90, ge=1, description="Raw webhook bodies older than this are deleted."
    )
    alert_retention_days: int = pydantic.Field(
        default=90,
        ge=0,
        description="Alert episodes that ended (resolved and handled) longer ago than this, "
        "with every run finished, keep only their alert name, severity and node/GPU labels; "
        "annotations and the generator URL are cleared, and episodes no run refers to are "
        "deleted. Runs and the audit log are kept. 0 keeps episodes whole.",
    )
    notify_channels: dict[str, NotifyChannel] = pydantic.Field(
        default_factory=dict,
        description="Notification channels by name (used by `notify` and the notices of the "
        "engine); see below for each type.",
    )
    notify_routing: notices.Routing = pydantic.Field(
        default_factory=notices.Routing,
        description="Where a notify step that names no channel sends: the owner of its "
        "workload, label routes (first match wins), else the default channel.",
    )
    plugins: list[str] = pydantic.Field(
        default_factory=list,
        description="Python modules with a `register(registry)` function adding actions.",
    )
    guards: guards_mod.GuardConfig = pydantic.Field(
        default_factory=guards_mod.GuardConfig,
        description="Fleet safety guards (budget, circuit breaker, per-node limits, change "
        "windows); playbooks may override them.",
    )
    guard_channel: str = pydantic.Field(
        default="default", description="Notification channel told when the breaker opens."
    )
    target_node_labels: list[str] = pydantic.Field(
        default_factory=lambda: list(targeting.DEFAULT_ORDER),
        min_length=1,
        description="Alert labels an alert's node is taken from, in order (a playbook's "
        "target.node_labels overrides it). A value counts only if it is an existing Node, the "
        "IP of a pod (instance=host:port of an exporter pod) or a pod in the alert's namespace, "
        "which stand for the node they run on; the first that does wins.",
    )
    alertmanager_url: pydantic.AnyHttpUrl | None = pydantic.Field(
        default=None,
        description="Alertmanager API for silences during disruptive runs (playbook `silence`).",
    )
    kubernetes: kube_adapter.KubernetesConfig | None = pydantic.Field(
        default=None,
        description="The cluster to act on (in-cluster, kubeconfig or URL + token). Without "
        "it, Kubernetes actions fail with a clear error and plans cannot read live state.",
    )
    artifact_dir: pathlib.Path = pydantic.Field(
        default=pathlib.Path("artifacts"), description="Where bug reports and other artifacts go."
    )
    driver_upgrade: driver_action.DriverUpgradeConfig = pydantic.Field(
        default_factory=driver_action.DriverUpgradeConfig,
        description="How gpu.upgrade_driver starts a node's driver upgrade: label (the GPU "
        "Operator's upgrade-state label, default) or a hook URL.",
    )
    gpu_exec: hostexec.GpuExecConfig = pydantic.Field(
        default_factory=hostexec.GpuExecConfig,
        description="Where GPU commands (nvidia-smi, dcgmi, bug reports) run, per node pool: "
        "the GPU Operator's driver pod (default), or for nodes whose driver is installed on "
        "the host a short-lived privileged pod on the node, deleted after each step.",
    )
    reboot: reboot_action.RebootConfig = pydantic.Field(
        default_factory=reboot_action.RebootConfig,
        description="How node.reboot reboots a host: manual (default: on-call is asked), a "
        "hook URL that power-cycles the machine out of band, or a privileged pod on the node.",
    )
    log_level: str = pydantic.Field(
        default="INFO",
        pattern=r"^(DEBUG|INFO|WARNING|ERROR)$",
        description="DEBUG, INFO, WARNING or ERROR.",
    )
    log_format: Literal["json", "text"] = pydantic.Field(
        default="json",
        description=(
            "One JSON object per log line, or plain text (one line a record: line feeds and "
            "control characters in it escaped, a traceback's lines indented)."
        ),
    )
    worker_id: str | None = pydantic.Field(
        default=None, description="Name of this replica in leases and the audit trail."
    )
    approval_timeout: float | None = pydantic.Field(
        default=4 * 3600.0,
        gt=0,
        description="Seconds a step waits for approval before it expires (null: never).",
    )
    approval_expiry_outcome: Literal["reject", "cancel"] = pydantic.Field(
        default="reject", description="What an expired approval does to its run."
    )
    approval_expiry_interval: float = pydantic.Field(
        default=30.0, gt=0, description="Seconds between checks for expired approvals."
    )
    approval_forbid_alert_sender: bool = pydantic.Field(
        default=True,
        description="The principal whose token delivered the alert that started a run cannot "
        "approve that run's steps (403); another principal must.",
    )
    reconcile_interval: float = pydantic.Field(
        default=300.0,
        gt=0,
        description="Seconds between reconciler passes, which compare the effects remediator "
        "applied with the cluster (one pass also runs at start-up).",
    )
    audit_key_file: pathlib.Path | None = pydantic.Field(
        default=None,
        description="HMAC key(s) for the audit chain, never stored in the database: a file "
        "holding one key (its name is the key id) or a directory of them (a mounted Kubernetes "
        "Secret). Without it the chain is plain sha256, which a database writer can recompute.",
    )
    audit_key_id: str | None = pydantic.Field(
        default=None,
        description="Which key of audit_key_file signs new events (needed when it holds "
        "several: rotation keeps old keys for verification).",
    )
    audit_anchor_file: pathlib.Path | None = pydantic.Field(
        default=None,
        description="JSON Lines file outside the database where the leader appends the audit "
        "chain head (signed with the audit key); `audit verify` compares the chain with it.",
    )
    audit_anchor_interval: float = pydantic.Field(
        default=300.0, gt=0, description="Seconds between audit chain anchors."
    )
    trusted_proxies: list[pydantic.IPvAnyNetwork] = pydantic.Field(
        default_factory=list,
        description="Addresses of authenticating reverse proxies whose user header is trusted.",
    )
    proxy_user_header: str | None = pydantic.Field(
        default=None,
        description="Header naming the authenticated user (e.g. X-Forwarded-User); honoured "
        "only from trusted_proxies. The user gets the roles of the tokens-file entry of that "
        "name.",
    )
    session_secret: pydantic.SecretStr | None = pydantic.Field(
        default=None,
        description="Key signing sign-in nonces and the CSRF tokens of browsers signed in by "
        "HTTP Basic or the proxy header (random per process if unset: set the same key on every "
        "replica that serves the web page). Sessions are kept in the database and need no key.",
    )
    session_ttl: float = pydantic.Field(
        default=12 * 3600.0,
        gt=0,
        description="Seconds a web session lasts. Sessions are kept in the database: signing "
        "out on one replica ends the session on all of them; the leader records the expiry of "
        "a session in the audit trail within a minute.",
    )
    cookie_secure: bool | None = pydantic.Field(
        default=None,
        description="Mark the session cookie Secure. Default: when the request came over TLS.",
    )
    auth_failure_limit: int = pydantic.Field(
        default=5,
        gt=0,
        description="Failed sign-ins (wrong token, on the page or the API) per client address "
        "and per token name within `auth_failure_window` before further attempts get 429.",
    )
    auth_failure_window: float = pydantic.Field(
        default=60.0, gt=0, description="Seconds over which failed sign-ins are counted."
    )

    leader_election: Literal["auto", "database", "kubernetes", "off"] = pydantic.Field(
        default="auto",
        description="Who runs the singleton loops (lease sweeper, approval expiry, retention, "
        "session sweep): "
        "`kubernetes` a coordination.k8s.io Lease, `database` a row in leader_leases, `off` "
        "every replica (one replica only). `auto`: kubernetes when `kubernetes` is set and "
        "running in a cluster, else database on Postgres and off on SQLite (one replica).",
    )
    leader_lease_seconds: float = pydantic.Field(
        default=15.0,
        ge=1,
        description="Leader lease duration; renewed every third of it. A dead leader's loops "
        "move to another replica within about this time.",
    )
    leader_lease_name: str = pydantic.Field(
        default="remediator", description="Name of the leader lease (row or Lease object)."
    )
    leader_lease_namespace: str | None = pydantic.Field(
        default=None,
        description="Namespace of the Kubernetes Lease. Default: the pod's own namespace, "
        "else `remediator`.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[pydantic_settings.BaseSettings],
        init_settings: pydantic_settings.PydanticBaseSettingsSource,
        env_settings: pydantic_settings.PydanticBaseSettingsSource,
        dotenv_settings: pydantic_settings.PydanticBaseSettingsSource,
        file_secret_settings: pydantic_settings.PydanticBaseSettingsSource,
    ) -> tuple[pydantic_settings.PydanticBaseSettingsSource, ...]:
        sources: list[pydantic_settings.PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _CONFIG_FILE.get()
        if config_file is not None:
            sources.append(
                pydantic_settings.YamlConfigSettingsSource(settings_cls, yaml_file=config_file)
            )
        return tuple(sources)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def should_migrate(self) -> bool:
        return self.is_sqlite if self.migrate_on_start is None else self.migrate_on_start

    @pydantic.model_validator(mode="after")
    def _notify_channels(self) -> Settings:
        for name, channel in self.notify_channels.items():
            if not re.fullmatch(notices.CHANNEL_NAME, name):
                raise ValueError(f"notify_channels: {name!r} is not a channel name")
            if channel.type == "alertmanager" and not channel.has_url:
                if self.alertmanager_url is None:
                    raise ValueError(
                        f"notify_channels.{name}: an alertmanager channel needs url (or the "
                        "alertmanager_url setting)"
                    )
                channel.url = pydantic.SecretStr(str(self.alertmanager_url))
            try:
                channel.check_sources()
            except ValueError as e:
                raise ValueError(f"notify_channels.{name}: {e}") from None
        routed = self.notify_routing.channel_names() - {self.notify_routing.default_channel}
        unknown = sorted(routed - set(self.notify_channels))
        if unknown:
            raise ValueError(f"notify_routing names channels that are not configured: {unknown}")
        return self

    @pydantic.field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("listen must be host:port")
        return value


def load(config: pathlib.Path | None = None, **overrides: Any) -> Settings:
    """Build settings; ``overrides`` (from the CLI) win over everything, ``None`` is ignored."""
    if config is not None and not config.is_file():
        raise FileNotFoundError(f"config file {config} does not exist")
    token = _CONFIG_FILE.set(config)
    try:
        return Settings(**{key: value for key, value in overrides.items() if value is not None})
    finally:
        _CONFIG_FILE.reset(token)
