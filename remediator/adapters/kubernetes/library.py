"""The parts of kubernetes_asyncio the adapter uses, imported without the generated classes.

Importing any module of kubernetes_asyncio first runs the ``__init__`` of its packages, and
those of ``kubernetes_asyncio``, ``kubernetes_asyncio.client`` and its ``api`` and ``models``
packages import every API class and every model class: ~960 modules, ~37 MB resident and ~0.6 s
of CPU. The adapter needs none of them: it sends its requests through ``ApiClient.call_api``
with its own paths and reads every answer as JSON. So these four packages are registered
without running their ``__init__``, and only the modules used are imported: the ``ApiClient``,
``Configuration``, ``rest`` and ``exceptions`` of ``client``, the websocket client of
``stream`` and the kubeconfig and in-cluster loaders of ``config``.

A deferred package runs its ``__init__``, in the same module object, the first time anything
asks it for a name it does not have yet (``client.CoreV1Api``, ``models.V1Pod``; a submodule
is imported on its own), so other code importing kubernetes_asyncio still finds the whole
library. If kubernetes_asyncio was imported before this module, nothing is deferred.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

DEFERRED = (
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
)


def _defer(name: str) -> None:
    """Register package ``name`` (its parent already registered) without running its body."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no package {name}", name=name)
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(attr: str) -> Any:
        if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")
        # anything else: run the package's own __init__ now (once), then look again
        del module.__dict__["__getattr__"]
        loader.exec_module(module)
        return getattr(module, attr)

    module.__dict__["__getattr__"] = __getattr__
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _narrow() -> None:
    if "kubernetes_asyncio" in sys.modules:
        return
    for name in DEFERRED:
        _defer(name)
    from kubernetes_asyncio.client import api_client, configuration, exceptions, rest

    # what the stream and config modules import from the package itself
    vars(sys.modules["kubernetes_asyncio.client"]).update(
        ApiClient=api_client.ApiClient,
        Configuration=configuration.Configuration,
        ApiException=exceptions.ApiException,
        rest=rest,
    )


_narrow()

# ruff: noqa: E402 - imported once the packages above are registered
import aiohttp
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.configuration import Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.incluster_config import load_incluster_config
from kubernetes_asyncio.config.kube_config import load_kube_config
from kubernetes_asyncio.stream.ws_client import WsApiClient

__all__ = [
    "ApiClient",
    "ApiException",
    "Configuration",
    "WsApiClient",
    "api_client",
    "call",
    "call_json",
    "load_incluster_config",
    "load_kube_config",
    "watch",
]

JSON = "application/json"
Query = Sequence[tuple[str, Any]]

# What aiohttp's ``trust_env`` reads for a request (besides ``.netrc``, which can only add a
# basic-auth header a bearer-token API server ignores).
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "ws_proxy", "wss_proxy", "all_proxy")


def api_client(configuration: Configuration) -> ApiClient:
    """An ``ApiClient``, whose session trusts the environment only when it names a proxy.

    The client's session is made with ``trust_env=True``, so aiohttp looks for proxy variables
    and reads ``~/.netrc`` again on every request, on a thread: an eighth of the engine's CPU
    in a storm, for nothing when no proxy is set. Without one, the session is replaced by one
    on the same connector that does not look (a proxy from the kubeconfig still applies)."""
    api = ApiClient(configuration=configuration)
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARIABLES):
        return api
    rest_client = api.rest_client
    trusting = rest_client.pool_manager
    connector = trusting.connector
    trusting.detach()  # the connector (pool, TLS context) now belongs to the new session
    rest_client.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=2**21
    )
    return api


async def call(
    api: ApiClient,
    method: str,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    query: Query = (),
    body: Any = None,
    accept: str = JSON,
    content_type: str | None = None,
    timeout: float | aiohttp.ClientTimeout | None = None,
) -> Any:
    """``ApiClient.call_api`` as the generated API classes call it (path parameters quoted,
    the bearer token, the client's host, TLS and session), the answer unread: an aiohttp
    response, or for a ``WsApiClient`` the websocket connection to await."""
    headers = {"Accept": accept} | ({"Content-Type": content_type} if content_type else {})
    return await api.call_api(
        path,
        method,
        dict(params or {}),
        list(query),
        headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=timeout,
    )


async def call_json(
    api: ApiClient,
    method: str,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    query: Query = (),
    body: Any = None,
    content_type: str = JSON,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One request, its answer read as plain JSON (never built into the client's models). A
    non-2xx answer raises the client's ``ApiException``, as a generated API method would."""
    response = await call(
        api,
        method,
        path,
        params=params,
        query=query,
        body=body,
        content_type=content_type,
        timeout=timeout,
    )
    try:
        data = await response.read()
    finally:
        response.release()
    _raise_for_status(response, data)
    found = json.loads(data) if data else {}
    return found if isinstance(found, dict) else {}


async def watch(
    api: ApiClient,
    path: str,
    *,
    query: Query = (),
    timeout: aiohttp.ClientTimeout | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """A watch request's events as plain JSON, one per line of the answer, until the server
    ends it (``timeout``'s read timeout bounds a silent connection)."""
    response = await call(api, "GET", path, query=[*query, ("watch", "true")], timeout=timeout)
    try:
        if not 200 <= response.status <= 299:
            _raise_for_status(response, await response.read())
        async for line in response.content:
            if line.strip():
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event
    finally:
        response.release()


def _raise_for_status(response: aiohttp.ClientResponse, data: bytes) -> None:
    """A non-2xx answer as the client's ``ApiException``, as a generated API method raises it."""
    if not 200 <= response.status <= 299:
        error: Any = ApiException(status=response.status, reason=response.reason)
        error.body = data.decode("utf-8", "replace")
        error.headers = response.headers
        raise error
