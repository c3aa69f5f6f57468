"""The Kubernetes cluster as the actions see it (implemented by ``adapters.kubernetes``).

Only the adapter knows kubernetes_asyncio; actions speak in these plain records, so they are
tested against the simulator through the real client and, in unit tests, against fakes of this
port. The adapter retries transport failures (429, 5xx, connection errors, timeouts, failed
websocket handshakes) itself, for a bounded time; what reaches an action is either a result or
one of the ``ClusterError`` classes below. Every failure that may pass if tried again later is
``temporary``: actions turn those into temporary step failures for the engine to retry.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import enum
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from remediator.domain import errors

# ---- errors -----------------------------------------------------------------------------


class ClusterError(errors.RemediatorError):
    """The Kubernetes API refused or could not answer. ``status`` is the HTTP status, if any."""

    code = "cluster_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    @property
    def temporary(self) -> bool:
        """Worth trying again later (the adapter has already retried within its bounds)."""
        return False


class NotFound(ClusterError, errors.NotFound):
    code = "not_found"


class Conflict(ClusterError, errors.Conflict):
    """409: a resourceVersion precondition failed or the object already exists."""

    code = "conflict"

    @property
    def temporary(self) -> bool:
        return True


class Forbidden(ClusterError, errors.Forbidden):
    code = "forbidden"


class Invalid(ClusterError):
    """400/422: the request can never succeed as sent."""

    code = "invalid"


class TooManyRequests(ClusterError):
    """429 that outlasted the adapter's retries."""

    code = "too_many_requests"

    @property
    def temporary(self) -> bool:
        return True


class Unavailable(ClusterError):
    """5xx, connection failures and timeouts that outlasted the adapter's retries."""

    code = "unavailable"

    @property
    def temporary(self) -> bool:
        return True


class ExecTimedOut(Unavailable):
    """An exec'd command gave no result within its timeout (it may still be running)."""

    code = "exec_timed_out"


class ExecInterrupted(Unavailable):
    """The exec stream ended before the command's exit status arrived: the command may have
    run, in part or in whole, or not at all."""

    code = "exec_interrupted"


# ---- records ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int | None
    """None when the command did not run or its status carried no code (see ``status``)."""
    status: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Taint:
    key: str
    effect: str
    value: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: list[Taint]
    unschedulable: bool
    resource_version: str
    uid: str = ""
    ready: bool | None = None
    """The node's ``Ready`` condition: True, False, or None (Unknown or not reported)."""
    boot_id: str = ""
    """``status.nodeInfo.bootID``: changes when the host reboots."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OwnerRef:
    kind: str
    name: str
    uid: str = ""
    controller: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node_name: str | None
    phase: str
    labels: dict[str, str]
    annotations: dict[str, str]
    owners: list[OwnerRef]
    volume_kinds: list[str]
    """Volume source kinds (``emptyDir``, ``hostPath``, …), one per volume."""
    containers: list[str]
    termination_grace_period_seconds: int | None
    deletion_timestamp: dt.datetime | None = None
    resource_version: str = ""
    ready: bool = False
    """The pod's ``Ready`` condition is ``True`` (every container passes its readiness probe)."""
    gpu_requests: int = 0
    """GPUs (``nvidia.com/gpu``) its containers are allocated, from their limits."""
    waiting: list[str] = dataclasses.field(default_factory=list)
    """Why containers are waiting, e.g. ``exec: ErrImagePull: <message>``."""
    terminated: list[str] = dataclasses.field(default_factory=list)
    """How containers ended, e.g. ``cuda: Error (exit 1): <message>``; for a pod the kubelet
    refused, its own reason and message."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NamespaceInfo:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PdbInfo:
    namespace: str
    name: str
    match_labels: dict[str, str]
    match_expressions: list[dict[str, Any]]
    disruptions_allowed: int | None
    current_healthy: int | None
    desired_healthy: int | None
    expected_pods: int | None


class EvictionOutcome(enum.StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget forbids it now
    GONE = "gone"  # 404: nothing to evict
    ERROR = "error"  # e.g. 500 when several budgets select the pod


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvictionResult:
    outcome: EvictionOutcome
    message: str = ""
    pdb: str | None = None
    """The blocking budget's name when the API said which one."""
    status: int | None = None
    retry_after: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ObjectRef:
    """What an Event is about."""

    kind: str  # "Node" or "Pod"
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"


# ---- the GPU fleet as a watch keeps it ----------------------------------------------------


class FleetSnapshot(Mapping[str, Mapping[str, str]]):
    """The GPU nodes (name → labels) at one moment, never changed after: what the guards count
    in a decision (the budget's percentage, pool sizes, the driver-upgrade hold)."""

    def __init__(self, labels: dict[str, Mapping[str, str]]) -> None:
        self._labels = labels
        self._pools: dict[str, collections.Counter[str | None]] = {}

    def __getitem__(self, name: str) -> Mapping[str, str]:
        return self._labels[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def pool_sizes(self, label: str) -> collections.Counter[str | None]:
        """GPU nodes per value of ``label`` (``None``: nodes without it), counted once per
        snapshot; a snapshot lives until the fleet's labels change, not one per decision."""
        sizes = self._pools.get(label)
        if sizes is None:
            sizes = collections.Counter(labels.get(label) for labels in self._labels.values())
            self._pools[label] = sizes
        return sizes


class GpuFleet:
    """The GPU nodes and their labels, kept current by whoever watches them (the adapter's
    node watch: one list, then each change, never a list per decision). Written on the event
    loop, read from engine transactions on a worker thread: ``snapshot`` is the only read, a
    consistent copy made once per change of labels."""

    def __init__(self, labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self._labels: dict[str, Mapping[str, str]] = dict(labels or {})
        self._lock = threading.Lock()
        self._snapshot: FleetSnapshot | None = None

    def replace(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        """Everything, as a fresh list shows it."""
        with self._lock:
            if labels != self._labels:
                self._labels = dict(labels)
                self._snapshot = None

    def put(self, name: str, labels: Mapping[str, str]) -> None:
        with self._lock:
            if self._labels.get(name) != labels:
                self._labels[name] = labels
                self._snapshot = None

    def remove(self, name: str) -> None:
        with self._lock:
            if self._labels.pop(name, None) is not None:
                self._snapshot = None

    def snapshot(self) -> FleetSnapshot:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = FleetSnapshot(dict(self._labels))
            return self._snapshot


# ---- the port ---------------------------------------------------------------------------


class Cluster(Protocol):
    @property
    def gpu_node_selector(self) -> str:
        """Label selector a node must match before any action may touch it."""
        ...

    @property
    def driver_namespace(self) -> str: ...

    @property
    def driver_selector(self) -> str: ...

    @property
    def driver_container(self) -> str: ...

    def is_gpu_node(self, node: NodeInfo) -> bool: ...

    async def get_node(self, name: str) -> NodeInfo: ...

    async def list_nodes(self, label_selector: str = "") -> list[NodeInfo]: ...

    async def gpu_fleet(self) -> GpuFleet | None:
        """The nodes matching ``gpu_node_selector``, kept current from then on (the first
        call lists them and starts the watch, later calls return at once); ``None`` while
        they could never be listed."""
        ...

    async def patch_node(
        self,
        name: str,
        *,
        unschedulable: bool | None = None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> NodeInfo:
        """Strategic merge when ``unschedulable`` is set, else JSON merge patch; ``None``
        values remove keys; ``resource_version`` is a precondition (``Conflict`` on 409)."""
        ...

    async def replace_node_taints(
        self, name: str, taints: list[Taint], *, resource_version: str
    ) -> NodeInfo:
        """Write the whole taint list, guarded by ``resource_version`` (``Conflict`` on 409)."""
        ...

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
        page_size: int = 500,
    ) -> list[PodInfo]: ...

    async def get_pod(self, namespace: str, name: str) -> PodInfo: ...

    async def get_namespace(self, name: str) -> NamespaceInfo:
        """A namespace's labels and annotations (who owns its workloads, for notices)."""
        ...

    async def evict_pod(
        self, namespace: str, name: str, *, grace_period_seconds: int | None = None
    ) -> EvictionResult: ...

    async def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> PodInfo: ...

    async def list_pdbs(self, namespace: str | None = None) -> list[PdbInfo]: ...

    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> PodInfo:
        """Create a pod; one that already exists under that name (a retried create that had
        landed) is read and returned instead."""
        ...

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod; one already gone is fine."""
        ...

    async def create_event(
        self, *, target: ObjectRef, reason: str, message: str, type: str = "Normal"
    ) -> str:
        """Record an Event about ``target``; returns the Event's name."""
        ...

    async def exec(
        self,
        *,
        namespace: str,
        pod: str,
        container: str | None,
        argv: list[str],
        timeout: float,
        idempotent: bool = False,
    ) -> ExecResult:
        """Run ``argv`` (never a shell) in the container.

        ``ExecTimedOut`` when a started command gives no result within ``timeout``,
        ``ExecInterrupted`` when its stream drops first, ``Unavailable`` when no stream could be
        opened. ``idempotent`` commands (reads: running them twice changes nothing) are run
        again when their stream drops, within the adapter's retry bounds.
        """
        ...

    async def find_driver_pod(
        self,
        node: str,
        *,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> PodInfo | None:
        """The running GPU driver pod on ``node`` (adapter defaults unless overridden)."""
        ...

    async def close(self) -> None: ...


# ---- label selectors (equality- and set-based), shared by the adapter and the fakes -------

_REQ = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_requirements(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Does ``labels`` satisfy the Kubernetes label ``selector``? Raises ValueError if bad."""
    for raw in _split_requirements(selector):
        match = _REQ.match(raw)
        if match is None:
            raise ValueError(f"invalid label selector requirement {raw.strip()!r}")
        key = match["key"]
        if match["neg"]:
            if match["op"] or match["setop"]:
                raise ValueError(f"invalid label selector requirement {raw.strip()!r}")
            if key in labels:
                return False
        elif match["op"] in ("=", "=="):
            if labels.get(key) != match["value"]:
                return False
        elif match["op"] == "!=":
            if labels.get(key) == match["value"]:
                return False
        elif match["setop"]:
            values = {v.strip() for v in match["values"].split(",") if v.strip()}
            if (match["setop"] == "in") != (labels.get(key) in values):
                return False
        elif key not in labels:
            return False
    return True
