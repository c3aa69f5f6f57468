"""Drain decisions follow kubectl's filters, in kubectl's order."""

from __future__ import annotations

import datetime as dt

from remediator.actions import drain
from remediator.ports import cluster as port

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def pod(
    name: str,
    *,
    owner: str | None = "ReplicaSet",
    volumes: tuple[str, ...] = (),
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
    deleted_ago: float | None = None,
) -> port.PodInfo:
    owners = [port.OwnerRef(kind=owner, name="o", controller=True)] if owner else []
    return port.PodInfo(
        namespace="ns",
        name=name,
        uid=name,
        node_name="gpu-node-01",
        phase=phase,
        labels={},
        annotations=annotations or {},
        owners=owners,
        volume_kinds=list(volumes),
        containers=["c"],
        termination_grace_period_seconds=30,
        deletion_timestamp=NOW - dt.timedelta(seconds=deleted_ago) if deleted_ago else None,
    )


def plan(pods: list[port.PodInfo], **params: object) -> drain.Plan:
    return drain.plan_drain(pods, drain.DrainParams.model_validate(params), now=NOW)


def test_daemonset_pods_are_skipped_never_evicted_when_ignored() -> None:
    result = plan([pod("ds", owner="DaemonSet"), pod("web")])
    assert [p.name for p in result.evict] == ["web"]
    assert "ns/ds" in result.skipped


def test_daemonset_pods_are_an_error_unless_ignored() -> None:
    result = plan([pod("ds", owner="DaemonSet")], ignore_daemonsets=False)
    assert "ns/ds" in result.errors


def test_mirror_pods_are_skipped() -> None:
    mirror = pod("static", owner="Node", annotations={drain.MIRROR: "x"})
    assert plan([mirror]).skipped == {"ns/static": "mirror pod: ignored"}


def test_emptydir_is_an_error_unless_deleting_its_data_is_allowed() -> None:
    scratch = pod("train", owner="StatefulSet", volumes=("emptyDir",))
    assert "ns/train" in plan([scratch]).errors
    allowed = plan([scratch], delete_emptydir_data=True)
    assert [p.name for p in allowed.evict] == ["train"]
    assert allowed.warnings == {"ns/train": "deleting emptyDir data"}


def test_unmanaged_pods_are_an_error_unless_forced() -> None:
    bare = pod("bare", owner=None)
    assert plan([bare]).errors == {"ns/bare": "declares no controller (set force)"}
    assert [p.name for p in plan([bare], force=True).evict] == ["bare"]


def test_finished_pods_are_always_fine() -> None:
    done = pod("job", owner=None, volumes=("emptyDir",), phase="Succeeded")
    result = plan([done])
    assert not result.errors
    assert [p.name for p in result.evict] == ["job"]


def test_pods_terminating_for_long_are_skipped_only_with_a_timeout() -> None:
    stuck = pod("stuck", deleted_ago=600)
    assert [p.name for p in plan([stuck]).evict] == ["stuck"]
    assert "ns/stuck" in plan([stuck], skip_wait_for_delete_timeout_seconds=60).skipped


def test_pdb_selection_uses_labels_and_expressions() -> None:
    pdb = port.PdbInfo(
        namespace="ns",
        name="p",
        match_labels={"app": "a"},
        match_expressions=[{"key": "tier", "operator": "In", "values": ["gpu"]}],
        disruptions_allowed=0,
        current_healthy=1,
        desired_healthy=1,
        expected_pods=1,
    )
    assert drain.pdb_selects(pdb, {"app": "a", "tier": "gpu"})
    assert not drain.pdb_selects(pdb, {"app": "a", "tier": "cpu"})


def test_label_selectors_match_like_kubernetes() -> None:
    labels = {"nvidia.com/gpu.present": "true", "zone": "a"}
    assert port.selector_matches("nvidia.com/gpu.present=true", labels)
    assert port.selector_matches("zone in (a, b),!maintenance", labels)
    assert not port.selector_matches("zone notin (a)", labels)
    assert not port.selector_matches("nvidia.com/gpu.present!=true", labels)
