"""What the Kubernetes actions share: the target node, the GPU-node guard, audit Events,
error translation and the read-modify-write loop for atomic node fields.

Failures the cluster may recover from (``ClusterError.temporary``: 5xx, 429, connection errors,
dropped exec streams) become temporary ``ActionFailed`` for the engine to retry. A failure that
comes after a change may have reached the cluster says so in its output, ``maybe_applied: true``,
next to what an undo needs (the previous values): the change is then counted as possibly made.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from remediator.actions import validation
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

logger = logging.getLogger("remediator.actions")

CORDONED_BY = "remediator.io/cordoned-by"
CONFLICT_ATTEMPTS = 5
MAYBE_APPLIED = "maybe_applied"
"""Output key of a failure after which the step's effect may be (partly) in place."""
T = TypeVar("T")


def run_marker(ctx: actions.ActionContext) -> str:
    return f"run-{ctx.run_id}"


def target_node(ctx: actions.ActionContext, param: str | None) -> str:
    """The node named in params, else the run's node; validated either way."""
    name = param or ctx.node
    if not name:
        raise errors.ActionFailed("no node: give params.node or run on an alert with a node")
    try:
        return validation.dns_subdomain(name)
    except ValueError as e:
        raise errors.ActionFailed(f"refused: {e}") from e


@contextlib.contextmanager
def cluster_errors(what: str) -> Iterator[None]:
    """Turn ``ClusterError`` into ``ActionFailed``, temporary when the cluster may recover."""
    try:
        yield
    except port.ClusterError as e:
        raise errors.ActionFailed(
            f"{what}: {e}", temporary=e.temporary, retry_after=e.retry_after
        ) from e


@contextlib.contextmanager
def changing(output: Mapping[str, Any] | Callable[[], Mapping[str, Any]]) -> Iterator[None]:
    """Around code that changes the cluster: a failure inside it may leave the change made
    (a write whose answer was lost, a command whose stream dropped, one GPU of several capped),
    so its output gets ``maybe_applied`` (unless the failure set it) and ``output`` (read when
    it fails: what undo needs)."""
    try:
        yield
    except (errors.ActionFailed, port.ClusterError) as e:
        failed = e if isinstance(e, errors.ActionFailed) else _failed(e)
        known = output() if callable(output) else output
        failed.output = {**known, MAYBE_APPLIED: True, **failed.output}
        if failed is e:
            raise
        raise failed from e


def _failed(e: port.ClusterError) -> errors.ActionFailed:
    return errors.ActionFailed(str(e), temporary=e.temporary, retry_after=e.retry_after)


async def gpu_node(cluster: port.Cluster, name: str) -> port.NodeInfo:
    """The node, if remediator may touch it; a permanent refusal otherwise."""
    with cluster_errors(f"reading node {name}"):
        try:
            node = await cluster.get_node(name)
        except port.NotFound as e:
            raise errors.ActionFailed(f"node {name} does not exist") from e
    if not cluster.is_gpu_node(node):
        raise errors.ActionFailed(
            f"refused: node {name} does not match the GPU node selector "
            f"{cluster.gpu_node_selector!r}; remediator only touches GPU nodes",
            output={"node": name, "refused": "not a GPU node"},
        )
    return node


async def emit_node_event(
    ctx: actions.ActionContext,
    cluster: port.Cluster,
    node: port.NodeInfo,
    *,
    reason: str,
    what: str,
    type: str = "Normal",
) -> str:
    """Best effort: an Event on the node so ``kubectl describe node`` shows what was done."""
    message = f"remediator run {ctx.run_id} (playbook {ctx.playbook}, step {ctx.step_key}): {what}"
    target = port.ObjectRef(kind="Node", name=node.name, uid=node.uid)
    try:
        name = await cluster.create_event(target=target, reason=reason, message=message, type=type)
    except port.ClusterError as e:
        logger.warning("could not record event %s on node %s: %s", reason, node.name, e)
        return f"failed: {e}"
    return name


async def with_conflict_retries(
    what: str, attempt: Callable[[], Awaitable[T]], *, attempts: int = CONFLICT_ATTEMPTS
) -> T:
    """Run a read-modify-write ``attempt`` again (fresh read) when its write hits a 409."""
    for number in range(1, attempts + 1):
        try:
            with cluster_errors(what):
                return await attempt()
        except errors.ActionFailed as e:
            if not isinstance(e.__cause__, port.Conflict) or number == attempts:
                raise
            logger.info("%s: conflict on attempt %d; reading again", what, number)
    raise AssertionError("unreachable")


def taint_dict(taint: port.Taint) -> dict[str, Any]:
    return taint.as_dict()


async def other_holders(ctx: actions.ActionContext, node: str) -> list[Any]:
    """Other active runs holding ``node``'s lock: the engine offers
    ``services['node_holders']`` to every step it runs (read from the store's locks when asked).
    A second line of defence behind the lock itself: a step of a run that does not hold the
    node (not exclusive, or acting on another node than its run's) finds the holder here.

    A context built without the engine (a preview) has no holders to ask.
    """
    holders = ctx.services.get("node_holders")
    if holders is None:
        return []
    found = holders(node)
    if isinstance(found, Awaitable):
        found = await found
    return [h for h in found or [] if h != ctx.run_id]


async def cordon(
    ctx: actions.ActionContext, cluster: port.Cluster, node: port.NodeInfo
) -> dict[str, Any]:
    """Cordon with the run's marker; a node already cordoned (by anyone) is left as it is."""
    if node.unschedulable:
        return {"cordoned": False, "cordoned_by": node.annotations.get(CORDONED_BY)}

    async def attempt() -> port.NodeInfo:
        fresh = await cluster.get_node(node.name)
        if fresh.unschedulable:
            return fresh
        return await cluster.patch_node(
            node.name,
            unschedulable=True,
            annotations={CORDONED_BY: run_marker(ctx)},
            resource_version=fresh.resource_version,
        )

    updated = await with_conflict_retries(f"cordoning node {node.name}", attempt)
    cordoned_by = updated.annotations.get(CORDONED_BY)
    event = await emit_node_event(
        ctx, cluster, updated, reason="RemediatorCordon", what="cordoned the node"
    )
    return {"cordoned": cordoned_by == run_marker(ctx), "cordoned_by": cordoned_by, "event": event}
