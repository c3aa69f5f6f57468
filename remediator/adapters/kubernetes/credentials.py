"""Settings → a kubernetes_asyncio ``Configuration``: in-cluster credentials, a kubeconfig (path
and context) or an explicit URL, with the token, CA and TLS options on top."""

from __future__ import annotations

import pathlib
from typing import Any

from remediator.adapters.kubernetes import config as config_mod
from remediator.adapters.kubernetes import library


async def client_configuration(settings: config_mod.KubernetesConfig) -> library.Configuration:
    cfg = library.Configuration()
    mode = settings.resolved_mode()
    if mode == "incluster":
        load_incluster: Any = library.load_incluster_config
        load_incluster(client_configuration=cfg)
    elif mode == "kubeconfig":
        await library.load_kube_config(
            config_file=settings.kubeconfig,
            context=settings.context,
            client_configuration=cfg,
        )
    else:
        cfg.host = (settings.url or "").rstrip("/")
    token = _token(settings)
    if token:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
    if settings.ca_file:
        cfg.ssl_ca_cert = settings.ca_file
    if settings.insecure_skip_tls_verify:
        cfg.verify_ssl = False
    return cfg


def _token(settings: config_mod.KubernetesConfig) -> str | None:
    if settings.token is not None:
        return settings.token.get_secret_value()
    if settings.token_file:
        return pathlib.Path(settings.token_file).read_text(encoding="utf-8").strip()
    return None
