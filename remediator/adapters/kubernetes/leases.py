"""``KubeLease``: ``ports.leader.LeaderLease`` over a ``coordination.k8s.io/v1`` Lease.

Read the Lease; create it when it is missing (409: someone else was first); otherwise replace it
with the ``resourceVersion`` that was read as a precondition, so of two replicas racing only one
write lands (the other gets 409 and stays a follower). A lease held by someone else is taken
over only after ``renewTime + leaseDurationSeconds``. No transport retries here: the elector
tries again at its next renew interval. Answers are read as plain JSON (``library.call_json``).
"""

from __future__ import annotations

import datetime as dt
import math
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from remediator.adapters.kubernetes import config as config_mod
from remediator.adapters.kubernetes import credentials, library, transport
from remediator.adapters.kubernetes.library import ApiClient, ApiException
from remediator.ports import cluster as cluster_port

NAMESPACE_FILE = config_mod.SERVICE_ACCOUNT / "namespace"
DEFAULT_NAMESPACE = "remediator"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"


def default_namespace(path: pathlib.Path = NAMESPACE_FILE) -> str:
    """The pod's own namespace in a cluster, else ``remediator`` (where deploy/ puts it)."""
    try:
        return path.read_text(encoding="utf-8").strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def _microtime(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> dt.datetime | None:
    if not value:
        return None
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


class KubeLease:
    def __init__(
        self,
        api_client: ApiClient,
        *,
        name: str,
        namespace: str,
        request_timeout: float = 5.0,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self._api = api_client
        self._name = name
        self.namespace = namespace
        self.request_timeout = request_timeout
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))

    @property
    def name(self) -> str:
        return self._name

    async def _call(
        self, what: str, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            return await library.call_json(
                self._api,
                method,
                path,
                params={"namespace": self.namespace, "name": self._name},
                body=body,
                timeout=self.request_timeout,
            )
        except (ApiException, OSError, TimeoutError) as e:
            raise transport.translate(e, what) from e

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self._call(f"get lease {self.namespace}/{self._name}", "GET", LEASE)
        except cluster_port.NotFound:
            return None

    def _body(self, spec: Mapping[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self._name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": dict(spec),
        }

    async def acquire_or_renew(self, holder: str, *, duration: float) -> bool:
        now = self.clock()
        seconds = max(1, math.ceil(duration))
        current = await self._read()
        if current is None:
            fresh: dict[str, Any] = {
                "holderIdentity": holder,
                "leaseDurationSeconds": seconds,
                "acquireTime": _microtime(now),
                "renewTime": _microtime(now),
                "leaseTransitions": 0,
            }
            return await self._write("create", self._body(fresh))
        spec = dict(current.get("spec") or {})
        previous = spec.get("holderIdentity") or ""
        if previous and previous != holder:
            renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
            held_for = float(spec.get("leaseDurationSeconds") or 0)
            if renewed is not None and renewed + dt.timedelta(seconds=held_for) > now:
                return False
        if previous != holder:
            spec["acquireTime"] = _microtime(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec |= {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "renewTime": _microtime(now),
        }
        version = (current.get("metadata") or {}).get("resourceVersion")
        return await self._write("replace", self._body(spec, version))

    async def _write(self, verb: str, body: dict[str, Any]) -> bool:
        what = f"{verb} lease {self.namespace}/{self._name}"
        try:
            if verb == "create":
                await self._call(what, "POST", LEASES, body)
            else:
                await self._call(what, "PUT", LEASE, body)
        except cluster_port.Conflict:
            return False  # another replica wrote first
        return True

    async def release(self, holder: str) -> None:
        current = await self._read()
        if current is None:
            return
        spec: dict[str, Any] = dict(current.get("spec") or {})
        if spec.get("holderIdentity") != holder:
            return
        spec.pop("holderIdentity", None)
        spec |= {"leaseDurationSeconds": 1, "renewTime": _microtime(self.clock())}
        version = (current.get("metadata") or {}).get("resourceVersion")
        await self._write("replace", self._body(spec, version))

    async def close(self) -> None:
        await self._api.close()


async def connect(
    settings: config_mod.KubernetesConfig, *, name: str, namespace: str | None = None
) -> KubeLease:
    """A lease with its own API client (closed by ``close``)."""
    configuration = await credentials.client_configuration(settings)
    return KubeLease(
        library.api_client(configuration),
        name=name,
        namespace=namespace or default_namespace(),
        request_timeout=min(settings.request_timeout, 5.0),
    )
