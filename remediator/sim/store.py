"""In-memory object store with etcd-like resource versions, history and watches.

Every mutation takes the next value of one global counter as the object's
``metadata.resourceVersion`` (as etcd's revision does), is appended to a bounded history and
is fanned out to watchers. A watch started from a resource version older than the history
gets a 410 ``Expired`` error event, as from kube-apiserver's watch cache.

A stored object is never changed in place: every write stores a new object (a copy of what
it was given), so reads that only look (``peek``, ``iter``, ``by_name``) and the changes
fanned out to watchers share the stored objects without copying them; ``get`` and ``list``
return copies for callers that modify what they read.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from remediator.sim import errors, resources, values

Obj = dict[str, Any]
Hook = Callable[[str, str, Obj], None]
Key = tuple[str, str]
PodSet = Literal["terminating", "unscheduled", "starting"]
POD_SETS: tuple[PodSet, ...] = ("terminating", "unscheduled", "starting")
Objects = dict[str, list[Obj]]
"""Objects by store key, as ``Store.dump`` returns them."""
HISTORY = 2000


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def timestamp(moment: datetime.datetime | None = None) -> str:
    return (moment or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp_precise() -> str:
    """Now, to the microsecond (for logs; object timestamps have whole seconds)."""
    return utcnow().isoformat(timespec="microseconds")


@dataclasses.dataclass(frozen=True)
class Change:
    """One write, as watchers see it. ``obj`` and ``old`` are the store's own objects (never
    changed in place, so shared without copies by every watcher): read them, never mutate."""

    rv: int
    store_key: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None
    lines: dict[str, bytes] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """The watch event lines already encoded for this change, by event type and the
    ``apiVersion`` it is served as: encoded once however many watches send it."""


class Watcher:
    def __init__(self, store: Store, store_key: str, namespace: str | None) -> None:
        self.store = store
        self.store_key = store_key
        self.namespace = namespace
        self.queue: asyncio.Queue[Change] = asyncio.Queue()

    def wants(self, change: Change) -> bool:
        if change.store_key != self.store_key:
            return False
        return self.namespace is None or change.obj["metadata"].get("namespace") == self.namespace

    def close(self) -> None:
        self.store.watchers.discard(self)


class Store:
    def __init__(self) -> None:
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self.history: collections.deque[Change] = collections.deque(maxlen=HISTORY)
        self.watchers: set[Watcher] = set()
        self.hooks: list[Hook] = []
        self.observers: list[Callable[[Change], None]] = []
        """Called with every change (the object before and after), after the hooks."""
        self._pods_by_node: dict[str, set[tuple[str, str]]] = {}
        """Pod keys by ``spec.nodeName`` ("" for unbound pods), kept up to date on every pod
        change (``_emit``): a pod written never costs a pass over every pod."""
        self._pods_by_owner: dict[str, set[Key]] = {}
        """Pod keys by the uid of their controller (``ownerReferences[].controller``)."""
        self._pod_sets: dict[PodSet, set[Key]] = {which: set() for which in POD_SETS}
        """Pod keys by what the controller loop has to do with them (``pod_set``): a pass
        visits the pods it has work for, never every pod of the fleet."""
        self.epoch = 0
        """Bumped when every object is replaced silently (``clear``, ``load``): whoever follows
        changes through hooks has to look at everything again."""
        self.scanned = 0
        """Objects looked at by reads (``iter``, ``iter_pods_on_node``) since the start: how
        tests tell a lookup by index from a scan of a whole collection."""

    # ---- reading ---------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def get(self, store_key: str, namespace: str, name: str) -> Obj | None:
        obj = self.by_name(store_key, namespace, name)
        return values.clone(obj) if obj is not None else None

    def must_get(self, store_key: str, namespace: str, name: str) -> Obj:
        return values.clone(self.must_by_name(store_key, namespace, name))

    def list(self, store_key: str, namespace: str | None = None) -> list[Obj]:
        return [values.clone(o) for o in self.iter(store_key, namespace)]

    def iter(self, store_key: str, namespace: str | None = None) -> Iterator[Obj]:
        """Iterate live objects without copying: callers must not mutate them."""
        bucket = self._objects[store_key]
        for key in sorted(bucket):
            self.scanned += 1
            if namespace is None or key[0] == namespace:
                yield bucket[key]

    def iter_pods_on_node(self, node: str, namespace: str | None = None) -> Iterator[Obj]:
        """``iter("pods", namespace)`` restricted to pods bound to ``node`` ("" for unbound
        ones), through an index: a sweep of a large fleet lists each node's pods once, which
        would otherwise scan every pod of the fleet for every node."""
        bucket = self._objects["pods"]
        for key in sorted(self._pods_by_node.get(node, ())):
            self.scanned += 1
            if namespace is None or key[0] == namespace:
                yield bucket[key]

    def iter_pods_of_owner(self, uid: str) -> Iterator[Obj]:
        """Pods whose controller (``ownerReferences[].controller``) has ``uid``, by index."""
        yield from self._iter_pods(self._pods_by_owner.get(uid, ()))

    def iter_pod_set(self, which: PodSet) -> Iterator[Obj]:
        """Pods the controller loop has work for, by index (see ``pod_set``)."""
        yield from self._iter_pods(self._pod_sets[which])

    def _iter_pods(self, keys: Iterable[Key]) -> Iterator[Obj]:
        bucket = self._objects["pods"]
        for key in sorted(keys):
            self.scanned += 1
            yield bucket[key]

    def peek(self, store_key: str, namespace: str, name: str) -> Obj | None:
        """``get`` without the copy: callers must not mutate the object."""
        self.scanned += 1
        return self.by_name(store_key, namespace, name)

    def by_name(self, store_key: str, namespace: str, name: str) -> Obj | None:
        """The stored object itself, as ``get`` finds it (not counted in ``scanned``: the
        API's reads by name, not a controller's visits): callers must not mutate it."""
        return self._objects[store_key].get((namespace, name))

    def must_by_name(self, store_key: str, namespace: str, name: str) -> Obj:
        """``by_name``, or the API's 404."""
        obj = self.by_name(store_key, namespace, name)
        if obj is None:
            res = resources.by_store_key(store_key)
            raise errors.not_found(res.name, name, group=res.group)
        return obj

    def _index_pod(self, obj: Obj | None, *, add: bool) -> None:
        if obj is None:
            return
        meta = obj["metadata"]
        node = (obj.get("spec") or {}).get("nodeName") or ""
        key = (meta.get("namespace", ""), meta["name"])
        owner = _controller_uid(obj)
        which = pod_set(obj)
        if add:
            self._pods_by_node.setdefault(node, set()).add(key)
            if owner is not None:
                self._pods_by_owner.setdefault(owner, set()).add(key)
            if which is not None:
                self._pod_sets[which].add(key)
            return
        _discard(self._pods_by_node, node, key)
        if owner is not None:
            _discard(self._pods_by_owner, owner, key)
        if which is not None:
            self._pod_sets[which].discard(key)

    def _reset_indexes(self) -> None:
        self._pods_by_node = {}
        self._pods_by_owner = {}
        self._pod_sets = {which: set() for which in POD_SETS}
        self.epoch += 1

    # ---- writing ---------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create(self, store_key: str, obj: Obj, *, shared: bool = False) -> Obj:
        """Store a new object (a copy of ``obj``) and return it: a copy, or with ``shared``
        the stored object itself, for a caller that only reads it (the API answering)."""
        obj = values.clone(obj)
        meta = obj.setdefault("metadata", {})
        res = resources.by_store_key(store_key)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise errors.ApiError(422, "name or generateName is required", reason="Invalid")
        namespace = meta.get("namespace", "") if res.namespaced else ""
        if res.namespaced and not namespace:
            namespace = meta["namespace"] = "default"
        if (namespace, name) in self._objects[store_key]:
            raise errors.already_exists(res.name, name, group=res.group)
        meta.pop("resourceVersion", None)
        meta["uid"] = meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = meta.get("creationTimestamp") or timestamp()
        if res.has_generation:
            meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()
        obj.setdefault("kind", res.kind)
        obj.setdefault("apiVersion", res.api_version)
        self._objects[store_key][(namespace, name)] = obj
        self._emit(store_key, "ADDED", obj, None)
        return obj if shared else values.clone(obj)

    def update(
        self, store_key: str, obj: Obj, *, check_rv: bool = True, shared: bool = False
    ) -> Obj:
        """Replace an object (by a copy of ``obj``); a non-empty ``metadata.resourceVersion``
        is a precondition. Returns the object as stored: a copy, or with ``shared`` the
        stored object itself, for a caller that only reads it (as ``create``)."""
        obj = values.clone(obj)
        res = resources.by_store_key(store_key)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if res.namespaced else ""
        name = meta.get("name", "")
        old = self._objects[store_key].get((namespace, name))
        if old is None:
            raise errors.not_found(res.name, name, group=res.group)
        wanted = meta.get("resourceVersion")
        if check_rv and wanted and wanted != old["metadata"]["resourceVersion"]:
            raise errors.conflict(res.name, name, group=res.group)
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        if res.has_generation:
            meta["generation"] = old["metadata"].get("generation", 1)
            if obj.get("spec") != old.get("spec"):
                meta["generation"] += 1
        obj["kind"] = old["kind"]
        obj["apiVersion"] = old["apiVersion"]
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if obj == old:
            return old if shared else values.clone(old)  # no-op writes keep their version
        meta["resourceVersion"] = self._next_rv()
        self._objects[store_key][(namespace, name)] = obj
        self._emit(store_key, "MODIFIED", obj, old)
        return obj if shared else values.clone(obj)

    def mutate(self, store_key: str, namespace: str, name: str, fn: Callable[[Obj], None]) -> Obj:
        """Read-modify-write without a precondition (for controllers)."""
        obj = self.must_get(store_key, namespace, name)
        fn(obj)
        return self.update(store_key, obj, check_rv=False)

    def set_deletion(self, store_key: str, namespace: str, name: str, grace: int) -> Obj:
        old = self._objects[store_key][(namespace, name)]
        obj = values.clone(old)
        meta = obj["metadata"]
        deadline = utcnow() + datetime.timedelta(seconds=grace)
        meta["deletionTimestamp"] = timestamp(deadline)
        meta["deletionGracePeriodSeconds"] = grace
        meta["resourceVersion"] = self._next_rv()
        self._objects[store_key][(namespace, name)] = obj
        self._emit(store_key, "MODIFIED", obj, old)
        return values.clone(obj)

    def delete(self, store_key: str, namespace: str, name: str) -> Obj:
        res = resources.by_store_key(store_key)
        old = self._objects[store_key].pop((namespace if res.namespaced else "", name), None)
        if old is None:
            raise errors.not_found(res.name, name, group=res.group)
        obj = values.clone(old)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(store_key, "DELETED", obj, old)
        return values.clone(obj)

    def clear(self) -> None:
        self._objects.clear()
        self.history.clear()
        self._reset_indexes()

    def dump(self) -> Objects:
        """Every object by store key (for a state file); the history is not kept."""
        return {
            key: [values.clone(obj) for _, obj in sorted(bucket.items())]
            for key, bucket in self._objects.items()
            if bucket
        }

    def load(self, objects: Objects, resource_version: int) -> None:
        """Replace every object with ``objects`` (from ``dump``), silently: no watch events,
        no hooks, an empty history (watches from an older resource version get 410)."""
        self._objects.clear()
        self.history.clear()
        self._reset_indexes()
        for store_key, items in objects.items():
            res = resources.by_store_key(store_key)
            for obj in items:
                meta = obj["metadata"]
                namespace = meta.get("namespace", "") if res.namespaced else ""
                self._objects[store_key][(namespace, meta["name"])] = values.clone(obj)
        for pod in self._objects["pods"].values():
            self._index_pod(pod, add=True)
        self._rv = resource_version

    # ---- watching --------------------------------------------------------------------

    def _emit(self, store_key: str, kind: str, obj: Obj, old: Obj | None) -> None:
        if store_key == "pods":  # the index follows the pod: off its old node, onto its new
            self._index_pod(old if kind != "DELETED" else obj, add=False)
            if kind != "DELETED":
                self._index_pod(obj, add=True)
        # no copies: a stored object is never changed in place (every write stores a new one)
        change = Change(int(obj["metadata"]["resourceVersion"]), store_key, kind, obj, old)
        self.history.append(change)
        for watcher in list(self.watchers):
            if watcher.wants(change):
                watcher.queue.put_nowait(change)
        for hook in list(self.hooks):
            hook(store_key, kind, obj)
        for observer in list(self.observers):
            observer(change)

    def watch(self, store_key: str, namespace: str | None, since: str | None) -> Watcher:
        """Start a watch. ``since`` empty/"0": synthetic ADDED for current objects first."""
        watcher = Watcher(self, store_key, namespace)
        if not since or since == "0":
            for obj in self.iter(store_key, namespace):
                rv = int(obj["metadata"]["resourceVersion"])
                watcher.queue.put_nowait(Change(rv, store_key, "ADDED", obj, None))
        else:
            try:
                start = int(since)
            except ValueError as e:
                raise errors.ApiError(400, f"invalid resource version: {since}") from e
            oldest = self.history[0].rv if self.history else self._rv + 1
            if start < oldest - 1 and start < self._rv:
                raise errors.ApiError(
                    410, f"too old resource version: {start} ({oldest - 1})", reason="Expired"
                )
            for change in self.history:
                if change.rv > start and watcher.wants(change):
                    watcher.queue.put_nowait(change)
        self.watchers.add(watcher)
        return watcher


def pod_set(pod: Obj) -> PodSet | None:
    """What the controller loop has to do with ``pod``: finish its termination, schedule it,
    start it (bound and ``Pending``), or nothing."""
    if pod["metadata"].get("deletionTimestamp"):
        return "terminating"
    if not (pod.get("spec") or {}).get("nodeName"):
        return "unscheduled"
    if (pod.get("status") or {}).get("phase") == "Pending":
        return "starting"
    return None


def _controller_uid(obj: Obj) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def _discard(index: dict[str, set[Key]], name: str, key: Key) -> None:
    keys = index.get(name)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[name]
