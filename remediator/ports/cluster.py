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
from collections.abc import Iterable, Iterator, Mapping
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


_Pools = collections.Counter[str | None]


def _merged(
    base: dict[str, Mapping[str, str]], changes: dict[str, Mapping[str, str] | None]
) -> Iterator[tuple[str, Mapping[str, str]]]:
    """Every node and its labels: the full copy's, as the changes since have left them."""
    yield from ((name, labels) for name, labels in base.items() if name not in changes)
    yield from ((name, labels) for name, labels in changes.items() if labels is not None)


def _count(nodes: Iterable[tuple[str, Mapping[str, str]]], label: str) -> _Pools:
    return collections.Counter(labels.get(label) for _, labels in nodes)


def _moved(sizes: _Pools, pool: str | None, by: int) -> None:
    sizes[pool] += by
    if not sizes[pool]:
        del sizes[pool]


class FleetSnapshot(Mapping[str, Mapping[str, str]]):
    """The GPU nodes (name → labels) at one moment, never changed after: what the guards count
    in a decision (the budget's percentage, pool sizes, the driver-upgrade hold).

    A full copy of the fleet (``base``, shared by snapshots and never changed) with the nodes
    changed since it was made on top (``changes``: the new labels, ``None`` for a node gone),
    and the pool sizes the fleet keeps counted: taking a snapshot after a label change
    copies the changes and the counts, not the fleet, so a storm that labels its nodes does
    not make every engine pass O(fleet)."""

    def __init__(
        self,
        base: dict[str, Mapping[str, str]],
        changes: dict[str, Mapping[str, str] | None],
        size: int,
        pools: dict[str, _Pools],
        fleet: GpuFleet | None = None,
    ) -> None:
        self._base = base
        self._changes = changes
        self._size = size
        self._pools = pools
        self._fleet = fleet

    def __getitem__(self, name: str) -> Mapping[str, str]:
        if name in self._changes:
            labels = self._changes[name]
            if labels is None:
                raise KeyError(name)
            return labels
        return self._base[name]

    def __contains__(self, name: object) -> bool:
        if name in self._changes:
            return self._changes[name] is not None
        return name in self._base

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in _merged(self._base, self._changes))

    def __len__(self) -> int:
        return self._size

    def pool_sizes(self, label: str) -> _Pools:
        """GPU nodes per value of ``label`` (``None``: nodes without it). The first time a
        label is asked for, this snapshot counts its nodes and the fleet starts keeping the
        count current, change by change; later snapshots copy it."""
        sizes = self._pools.get(label)
        if sizes is None:
            sizes = _count(_merged(self._base, self._changes), label)
            self._pools[label] = sizes
            if self._fleet is not None:
                self._fleet.keep_counting(label)
        return sizes


class GpuFleet:
    """The GPU nodes and their labels, kept current by whoever watches them (the adapter's
    node watch: one list, then each change, never a list per decision). Written on the event
    loop, read from engine transactions on a worker thread: ``snapshot`` is the only read, a
    consistent view made once per change of labels.

    Changes are kept beside a full copy of the fleet until they are an eighth of it (or
    ``MAX_CHANGES``); then the next snapshot makes a new full copy, amortised over the
    changes. The pool sizes the guards asked for are kept counted change
    by change. So a snapshot after one change costs the changes since the last copy, never a
    walk over the fleet."""

    MAX_CHANGES = 1024

    def __init__(self, labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self._base: dict[str, Mapping[str, str]] = dict(labels or {})
        self._changes: dict[str, Mapping[str, str] | None] = {}
        self._size = len(self._base)
        self._pools: dict[str, _Pools] = {}
        self._lock = threading.Lock()
        self._snapshot: FleetSnapshot | None = None

    def _current(self, name: str) -> Mapping[str, str] | None:
        if name in self._changes:
            return self._changes[name]
        return self._base.get(name)

    def replace(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        """Everything, as a fresh list shows it."""
        with self._lock:
            if len(labels) == self._size and all(
                self._current(name) == value for name, value in labels.items()
            ):
                return
            self._base = dict(labels)
            self._changes = {}
            self._size = len(self._base)
            self._pools = {label: _count(self._base.items(), label) for label in self._pools}
            self._snapshot = None

    def put(self, name: str, labels: Mapping[str, str]) -> None:
        with self._lock:
            before = self._current(name)
            if before != labels:
                self._change(name, before, labels)

    def remove(self, name: str) -> None:
        with self._lock:
            before = self._current(name)
            if before is not None:
                self._change(name, before, None)

    def _change(
        self, name: str, before: Mapping[str, str] | None, after: Mapping[str, str] | None
    ) -> None:
        self._size += (after is not None) - (before is not None)
        for label, sizes in self._pools.items():
            if before is not None:
                _moved(sizes, before.get(label), -1)
            if after is not None:
                _moved(sizes, after.get(label), +1)
        if after is None and name not in self._base:
            self._changes.pop(name, None)  # added and gone since the copy: nothing to keep
        elif after is not None and self._base.get(name) == after:
            self._changes.pop(name, None)  # back as the copy has it
        else:
            self._changes[name] = after
        self._snapshot = None

    def keep_counting(self, label: str) -> None:
        """Keep ``label``'s pool sizes counted from now on (one walk over the fleet, once).
        The next snapshot copies the count; the current one has counted its own."""
        with self._lock:
            if label not in self._pools:
                self._pools[label] = _count(_merged(self._base, self._changes), label)

    def snapshot(self) -> FleetSnapshot:
        with self._lock:
            if self._snapshot is None:
                if len(self._changes) > min(self.MAX_CHANGES, len(self._base) // 8):
                    self._compact()
                self._snapshot = FleetSnapshot(
                    self._base,
                    dict(self._changes),
                    self._size,
                    {label: sizes.copy() for label, sizes in self._pools.items()},
                    self,
                )
            return self._snapshot

    def _compact(self) -> None:
        self._base = dict(_merged(self._base, self._changes))
        self._changes = {}


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

    async def gpu_nodes(self) -> list[NodeInfo]:
        """The nodes matching ``gpu_node_selector``: the watch's copies while it keeps them
        current (``gpu_fleet`` started it), else listed from the API server."""
        ...

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
