"""The notify action: owner lookup on the pod, routing, and the resolve its undo sends."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from remediator.actions import basic
from remediator.adapters import notify
from remediator.domain import notices
from remediator.ports import actions
from remediator.ports import cluster as port
from tests.support.notify import RecordingServer

AT = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class PodsOnly:
    """The two cluster reads the notify action makes."""

    def __init__(
        self, pods: dict[str, port.PodInfo], namespaces: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.pods = pods
        self.namespaces = namespaces or {}

    async def get_namespace(self, name: str) -> port.NamespaceInfo:
        if name not in self.namespaces:
            raise port.Forbidden(f"namespaces {name!r} is forbidden", status=403)
        return port.NamespaceInfo(name=name, labels=self.namespaces[name], annotations={})

    async def get_pod(self, namespace: str, name: str) -> port.PodInfo:
        try:
            return self.pods[f"{namespace}/{name}"]
        except KeyError:
            raise port.NotFound(f"pod {namespace}/{name} not found", status=404) from None


def _pod(namespace: str, name: str, **meta: dict[str, str]) -> port.PodInfo:
    return port.PodInfo(
        namespace=namespace,
        name=name,
        uid="u",
        node_name="gpu-node-07",
        phase="Running",
        labels=meta.get("labels", {}),
        annotations=meta.get("annotations", {}),
        owners=[],
        volume_kinds=[],
        containers=["main"],
        termination_grace_period_seconds=30,
    )


@pytest.fixture
async def server(aiohttp_server) -> RecordingServer:
    return await RecordingServer().start(aiohttp_server)


def _ctx(notifier: Any, cluster: Any, **changes: Any) -> actions.ActionContext:
    ctx = actions.ActionContext(
        run_id=7,
        step_id=21,
        step_key="notify-owner",
        attempt=1,
        playbook="gpu-utilization-low",
        node="gpu-node-07",
        gpu="3",
        labels={"alertname": "GPUUtilizationLow", "namespace": "research"},
        annotations={},
        dry_run=False,
        now=lambda: AT,
        notifier=notifier,
        cluster=cluster,
    )
    return dataclasses.replace(ctx, **changes)


def _notifier(server: RecordingServer) -> notify.WebhookNotifier:
    channels = {
        "default": {"url": server.url("/default")},
        "vision": {"type": "slack", "url": server.url("/vision")},
        "page": {"type": "alertmanager", "url": server.url("/am")},
    }
    routing = notices.Routing.model_validate({"owner": {"channels": {"vision-team": "vision"}}})
    return notify.WebhookNotifier(
        {name: notify.NotifyChannel.model_validate(c) for name, c in channels.items()},
        routing=routing,
        attempts=1,
    )


PARAMS = {"message": "idle GPU", "owner": {"namespace": "research", "pod": "jupyter-alice"}}


async def test_the_owner_label_on_the_pod_picks_the_teams_channel(server):
    cluster = PodsOnly(
        {
            "research/jupyter-alice": _pod(
                "research", "jupyter-alice", labels={"team": "vision-team"}
            )
        }
    )
    action = basic.NotifyAction()
    out = await action.apply(_ctx(_notifier(server), cluster), action.parse(PARAMS))
    assert [r["path"] for r in server.requests] == ["/vision"]
    assert out["owner"] == "vision-team"
    assert out["routed_by"] == "owner vision-team (pod label team)"


async def test_an_owner_annotation_counts_too_and_unknown_owners_go_to_the_default(server):
    cluster = PodsOnly(
        {"research/jupyter-alice": _pod("research", "jupyter-alice", annotations={"owner": "bob"})}
    )
    action = basic.NotifyAction()
    out = await action.apply(_ctx(_notifier(server), cluster), action.parse(PARAMS))
    assert out["channel"] == "default"
    assert out["owner"] == "bob"
    assert server.bodies("/default")[0]["message"] == "idle GPU"


async def test_without_an_owner_on_the_pod_the_namespace_label_counts(server):
    cluster = PodsOnly(
        {"research/jupyter-alice": _pod("research", "jupyter-alice", labels={"app": "nb"})},
        namespaces={"research": {"team": "vision-team"}},
    )
    action = basic.NotifyAction()
    out = await action.apply(_ctx(_notifier(server), cluster), action.parse(PARAMS))
    assert out["routed_by"] == "owner vision-team (namespace label team)"
    assert "owner_lookup_error" not in out
    about_namespace = action.parse({"message": "m", "owner": {"namespace": "research"}})
    out = await action.apply(_ctx(_notifier(server), cluster), about_namespace)
    assert out["channel"] == "vision"


async def test_an_empty_owner_means_no_workload(server):
    action = basic.NotifyAction()
    params = action.parse({"message": "m", "owner": {"namespace": "", "pod": ""}})
    out = await action.apply(_ctx(_notifier(server), PodsOnly({})), params)
    assert out["channel"] == "default"
    assert "owner_lookup_error" not in out


async def test_a_pod_that_cannot_be_read_still_notifies_the_default_channel(server):
    action = basic.NotifyAction()
    out = await action.apply(_ctx(_notifier(server), PodsOnly({})), action.parse(PARAMS))
    assert out["channel"] == "default"
    assert out["delivered"] is True
    assert (
        "pod research/jupyter-alice: pod research/jupyter-alice not found"
        in (out["owner_lookup_error"])
    )
    no_cluster = await action.apply(_ctx(_notifier(server), None), action.parse(PARAMS))
    assert no_cluster["owner_lookup_error"] == "no cluster configured"


async def test_undo_resolves_on_the_channel_the_notice_went_to(server):
    action = basic.NotifyAction()
    params = action.parse({"message": "drain waits for approval", "channel": "page"})
    ctx = _ctx(_notifier(server), None)
    applied = await action.apply(ctx, params)
    await action.undo(dataclasses.replace(ctx, applied_output=applied), params)
    fired, resolved = server.bodies("/am/api/v2/alerts")
    assert fired[0]["labels"] == resolved[0]["labels"]
    assert "endsAt" not in fired[0]
    assert resolved[0]["endsAt"] == AT.isoformat()
    keys = [r["headers"]["Idempotency-Key"] for r in server.requests]
    assert keys == ["run-7-step-21", "run-7-step-21-resolve"]


def test_a_notify_step_names_no_channel_by_default_and_describes_where_it_goes():
    action = basic.NotifyAction()
    assert action.parse({"message": "m"}).channel is None
    assert action.describe(action.parse(PARAMS)) == (
        "notify the owner of research/jupyter-alice: idle GPU"
    )
    assert action.describe(action.parse({"message": "m", "resolve": True})) == (
        "resolve on the routed channel: m"
    )


async def test_a_plan_shows_where_the_notice_would_go_and_sends_nothing(server):
    pod = _pod("research", "jupyter-alice", labels={"team": "vision-team"})
    cluster = PodsOnly({"research/jupyter-alice": pod}, namespaces={"research": {}})
    action = basic.NotifyAction()
    preview = await action.preview(_ctx(_notifier(server), cluster), action.parse(PARAMS))
    assert preview["route"] == {
        "channel": "vision",
        "routed_by": "owner vision-team (pod label team)",
        "type": "slack",
        "owner": "vision-team",
    }
    assert preview["would"] == "notify the owner of research/jupyter-alice: idle GPU"
    assert server.requests == []
