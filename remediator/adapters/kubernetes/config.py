"""Settings for the Kubernetes adapter (plain pydantic: reading them imports no kubernetes_asyncio;
``credentials`` turns them into the client's Configuration)."""

from __future__ import annotations

import os
import pathlib
from typing import Literal

import pydantic

SERVICE_ACCOUNT = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubernetesConfig(pydantic.BaseModel):
    """How to reach the API server, and the GPU conventions of the cluster."""

    model_config = pydantic.ConfigDict(extra="forbid")

    mode: Literal["auto", "incluster", "kubeconfig", "url"] = "auto"
    kubeconfig: str | None = None
    """Path to a kubeconfig file (default: $KUBECONFIG or ~/.kube/config)."""
    context: str | None = None
    url: str | None = None
    token: pydantic.SecretStr | None = None
    token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False
    request_timeout: float = pydantic.Field(30.0, gt=0)
    retry_attempts: int | None = pydantic.Field(None, ge=1, le=1000)
    """Optional cap on the attempts per request; default: only ``retry_max_seconds`` bounds
    them."""
    retry_max_seconds: float = pydantic.Field(15.0, gt=0, le=600)
    """How long one request is retried with backoff when it fails in a way that may pass (429,
    5xx, connection errors, timeouts, failed websocket handshakes, dropped exec streams of
    idempotent commands). Keep it short: it holds up the step, which is itself retried later."""
    gpu_node_selector: str = "nvidia.com/gpu.present=true"
    driver_namespace: str = "gpu-operator"
    driver_selector: str = "app.kubernetes.io/component=nvidia-driver"
    driver_container: str = "nvidia-driver-ctr"
    remediator_name: str = "remediator"
    """``source.component`` / ``reportingComponent`` of the Events remediator writes."""
    event_namespace: str = "default"
    """Namespace for Events about nodes (kubectl looks for them in ``default``)."""

    @pydantic.model_validator(mode="after")
    def _mode_has_what_it_needs(self) -> KubernetesConfig:
        if self.mode == "url" and not self.url:
            raise ValueError("mode 'url' needs url")
        if self.token is not None and self.token_file is not None:
            raise ValueError("give token or token_file, not both")
        return self

    def resolved_mode(self) -> Literal["incluster", "kubeconfig", "url"]:
        if self.mode != "auto":
            return self.mode
        if self.url:
            return "url"
        if self.kubeconfig:
            return "kubeconfig"
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT / "token").exists():
            return "incluster"
        return "kubeconfig"
