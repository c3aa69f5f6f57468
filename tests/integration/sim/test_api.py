"""The simulator's Kubernetes API, driven by the real kubernetes_asyncio client over HTTP."""

from __future__ import annotations

import asyncio
import datetime
import json

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException

from remediator.sim import testing

GPU_NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]


async def test_discovery_lists_eviction_and_policy_versions(api_client: client.ApiClient) -> None:
    resources = await client.CoreV1Api(api_client).get_api_resources()
    names = {r.name: r for r in resources.resources}
    assert names["pods/eviction"].kind == "Eviction"
    assert names["pods/eviction"].group == "policy"
    assert "pods/exec" in names
    groups = await client.ApisApi(api_client).get_api_versions()
    policy = next(g for g in groups.groups if g.name == "policy")
    assert [v.version for v in policy.versions] == ["v1", "v1beta1"]
    assert policy.preferred_version.group_version == "policy/v1"
    version = await client.VersionApi(api_client).get_code()
    assert version.major == "1"


async def test_unauthenticated_requests_get_a_401_status(sim_server: testing.RunningSim) -> None:
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with http.get(f"{sim_server.url}/api/v1/nodes", headers=headers) as resp:
                assert resp.status == 401
                body = await resp.json()
        assert body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }
        async with http.get(f"{sim_server.url}/sim/v1/state") as resp:
            assert resp.status == 401


async def test_unknown_resources_answer_404_with_a_status_body(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as info:
        await core.read_node("no-such-node")
    assert info.value.status == 404
    body = json.loads(info.value.body)
    assert body["reason"] == "NotFound"
    assert body["message"] == 'nodes "no-such-node" not found'
    assert body["details"] == {"name": "no-such-node", "kind": "nodes"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("nvidia.com/gpu.present=true", GPU_NODES),
        ("nvidia.com/gpu.present==true", GPU_NODES),
        ("nvidia.com/gpu.present!=true", ["cpu-node-01"]),
        ("nvidia.com/gpu.product in (NVIDIA-H200, A100)", ["gpu-node-04"]),
        ("nvidia.com/gpu.product notin (NVIDIA-H100-80GB-HBM3)", ["cpu-node-01", "gpu-node-04"]),
        ("nvidia.com/gpu.present", GPU_NODES),
        ("!nvidia.com/gpu.present", ["cpu-node-01"]),
        ("nvidia.com/gpu.present,kubernetes.io/hostname=gpu-node-02", ["gpu-node-02"]),
    ],
)
async def test_node_label_selectors_filter_like_the_apiserver(
    core: client.CoreV1Api, selector: str, expected: list[str]
) -> None:
    nodes = await core.list_node(label_selector=selector)
    assert nodes.kind == "NodeList"
    assert [n.metadata.name for n in nodes.items] == expected


async def test_pod_field_selectors_select_by_node_name_phase_and_namespace(
    core: client.CoreV1Api,
) -> None:
    on_node = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-03")
    assert {p.metadata.name for p in on_node.items} >= {"jupyter-alice"}
    assert all(p.spec.node_name == "gpu-node-03" for p in on_node.items)
    named = await core.list_namespaced_pod(
        "ml-training", field_selector="metadata.name=llama-finetune-0,status.phase=Running"
    )
    assert [p.metadata.name for p in named.items] == ["llama-finetune-0"]
    not_default = await core.list_pod_for_all_namespaces(
        field_selector="metadata.namespace!=gpu-operator"
    )
    assert all(p.metadata.namespace != "gpu-operator" for p in not_default.items)
    with pytest.raises(ApiException) as info:
        await core.list_pod_for_all_namespaces(field_selector="spec.bogus=1")
    assert info.value.status == 400


async def test_pod_lists_page_with_limit_and_continue(core: client.CoreV1Api) -> None:
    everything = await core.list_pod_for_all_namespaces()
    seen: list[str] = []
    token = None
    while True:
        page = await core.list_pod_for_all_namespaces(limit=3, _continue=token)
        assert len(page.items) <= 3
        seen += [f"{p.metadata.namespace}/{p.metadata.name}" for p in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == len(everything.items) - len(seen)
    assert seen == [f"{p.metadata.namespace}/{p.metadata.name}" for p in everything.items]


async def test_replacing_a_node_with_a_stale_resource_version_conflicts(
    core: client.CoreV1Api,
) -> None:
    node = await core.read_node("gpu-node-01")
    node.metadata.labels["first"] = "write"
    updated = await core.replace_node("gpu-node-01", node)
    assert int(updated.metadata.resource_version) > int(node.metadata.resource_version)
    node.metadata.labels["second"] = "write"
    with pytest.raises(ApiException) as info:
        await core.replace_node("gpu-node-01", node)
    assert info.value.status == 409
    body = json.loads(info.value.body)
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on nodes "gpu-node-01": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


async def test_cordon_by_strategic_merge_patch_sets_unschedulable(
    core: client.CoreV1Api,
) -> None:
    node = await core.patch_node("gpu-node-02", {"spec": {"unschedulable": True}})
    assert node.spec.unschedulable is True
    assert node.spec.taints[0].key == "nvidia.com/gpu"  # untouched
    node = await core.patch_node("gpu-node-02", {"spec": {"unschedulable": None}})
    assert node.spec.unschedulable is None


async def test_merge_patch_sets_and_removes_labels_with_a_resource_version_precondition(
    core: client.CoreV1Api,
) -> None:
    node = await core.patch_node(
        "gpu-node-03",
        {"metadata": {"labels": {"gpu-status": "faulty"}}},
        _content_type="application/merge-patch+json",
    )
    assert node.metadata.labels["gpu-status"] == "faulty"
    node = await core.patch_node(
        "gpu-node-03",
        {"metadata": {"labels": {"gpu-status": None}}},
        _content_type="application/merge-patch+json",
    )
    assert "gpu-status" not in node.metadata.labels
    with pytest.raises(ApiException) as info:
        await core.patch_node(
            "gpu-node-03",
            {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}},
            _content_type="application/merge-patch+json",
        )
    assert info.value.status == 409


async def test_json_patch_replaces_the_taint_list(core: client.CoreV1Api) -> None:
    taint = {"key": "gpu-status", "value": "faulty", "effect": "NoSchedule"}
    node = await core.patch_node(
        "gpu-node-04",
        [
            {"op": "test", "path": "/spec/taints/0/key", "value": "nvidia.com/gpu"},
            {"op": "add", "path": "/spec/taints/-", "value": taint},
        ],
    )
    assert [t.key for t in node.spec.taints] == ["nvidia.com/gpu", "gpu-status"]
    with pytest.raises(ApiException) as info:
        await core.patch_node("gpu-node-04", [{"op": "remove", "path": "/spec/nope"}])
    assert info.value.status == 422


async def test_watching_nodes_streams_modifications_from_a_resource_version(
    core: client.CoreV1Api,
) -> None:
    nodes = await core.list_node()
    rv = nodes.metadata.resource_version
    await core.patch_node("gpu-node-01", {"metadata": {"labels": {"watched": "yes"}}})
    stream = watch.Watch()
    events = []
    async with asyncio.timeout(5):
        async for event in stream.stream(core.list_node, resource_version=rv, timeout_seconds=2):
            events.append(event)
            break
    await stream.close()
    assert events[0]["type"] == "MODIFIED"
    assert events[0]["object"].metadata.labels["watched"] == "yes"


async def test_watch_without_resource_version_starts_with_added_events_and_times_out(
    sim_server: testing.RunningSim,
) -> None:
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:
        url = (
            f"{sim_server.url}/api/v1/nodes?watch=true&timeoutSeconds=1&labelSelector="
            "nvidia.com/gpu.present"
        )
        async with asyncio.timeout(5), http.get(url) as resp:
            lines = [json.loads(line) async for line in resp.content if line.strip()]
    assert [e["type"] for e in lines] == ["ADDED"] * 4
    assert lines[0]["object"]["kind"] == "Node"


async def test_a_stale_watch_gets_a_410_expired_error_event(
    sim_server: testing.RunningSim,
) -> None:
    for i in range(2100):  # overflow the watch history
        sim_server.store.mutate(
            "nodes",
            "",
            "cpu-node-01",
            lambda n, i=i: n["metadata"].setdefault("labels", {}).update({"i": str(i)}),
        )
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:
        url = f"{sim_server.url}/api/v1/nodes?watch=true&resourceVersion=2&timeoutSeconds=1"
        async with asyncio.timeout(5), http.get(url) as resp:
            lines = [json.loads(line) async for line in resp.content if line.strip()]
    assert lines[0]["type"] == "ERROR"
    assert lines[0]["object"]["code"] == 410
    assert lines[0]["object"]["reason"] == "Expired"


async def test_events_are_created_and_listed_by_involved_object(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
) -> None:
    node = await core.read_node("gpu-node-01")
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="gpu-node-01."),
        involved_object=client.V1ObjectReference(
            kind="Node", name="gpu-node-01", uid=node.metadata.uid
        ),
        reason="Cordoned",
        message="cordoned by remediator",
        type="Normal",
        source=client.V1EventSource(component="remediator"),
    )
    created = await core.create_namespaced_event("default", event)
    assert created.metadata.name.startswith("gpu-node-01.")
    found = await core.list_event_for_all_namespaces(
        field_selector="involvedObject.kind=Node,involvedObject.name=gpu-node-01"
    )
    assert [e.reason for e in found.items] == ["Cordoned"]
    events_v1 = client.EventsV1Api(api_client)
    await events_v1.create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="x.1"),
            event_time=datetime.datetime.now(datetime.UTC),
            reason="Drained",
            regarding=client.V1ObjectReference(kind="Node", name="gpu-node-01"),
            reporting_controller="remediator",
            reporting_instance="r-1",
            action="Drain",
            type="Normal",
        ),
    )
    listed = await events_v1.list_event_for_all_namespaces(
        field_selector="regarding.name=gpu-node-01"
    )
    assert [e.reason for e in listed.items] == ["Drained"]


async def test_namespaces_are_listed_and_read(core: client.CoreV1Api) -> None:
    names = [n.metadata.name for n in (await core.list_namespace()).items]
    assert {"gpu-operator", "ml-training", "inference", "research", "default"} <= set(names)
    ns = await core.read_namespace("gpu-operator")
    assert ns.status.phase == "Active"


async def test_leases_conflict_on_a_stale_update(api_client: client.ApiClient) -> None:
    coord = client.CoordinationV1Api(api_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="remediator", namespace="default"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )
    created = await coord.create_namespaced_lease("default", lease)
    with pytest.raises(ApiException) as info:
        await coord.create_namespaced_lease("default", lease)
    assert info.value.status == 409
    assert json.loads(info.value.body)["reason"] == "AlreadyExists"
    created.spec.holder_identity = "b"
    await coord.replace_namespaced_lease("remediator", "default", created)
    created.spec.holder_identity = "c"
    with pytest.raises(ApiException) as info:
        await coord.replace_namespaced_lease("remediator", "default", created)
    assert info.value.status == 409
    assert (await coord.read_namespaced_lease("remediator", "default")).spec.holder_identity == "b"


async def test_leader_election_acquires_the_lease(
    sim_server: testing.RunningSim, api_client: client.ApiClient
) -> None:
    from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
    from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

    elected = asyncio.Event()

    async def on_started() -> None:
        elected.set()

    async def on_stopped() -> None:
        pass

    lock = LeaseLock("remediator-leader", "default", "me", api_client)
    config = electionconfig.Config(
        lock,
        lease_duration=4,
        renew_deadline=3,
        retry_period=1,
        onstarted_leading=on_started,
        onstopped_leading=on_stopped,
    )
    task = asyncio.create_task(leaderelection.LeaderElection(config).run())
    try:
        async with asyncio.timeout(5):
            await elected.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    lease = sim_server.store.must_get("leases.coordination.k8s.io", "default", "remediator-leader")
    assert lease["spec"]["holderIdentity"] == "me"


async def test_kubectl_style_table_requests_get_server_side_printing(
    sim_server: testing.RunningSim,
) -> None:
    accept = (
        "application/json;as=Table;v=v1;g=meta.k8s.io,"
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
    )
    headers = {**sim_server.headers, "Accept": accept}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(f"{sim_server.url}/api/v1/namespaces/research/pods") as resp,
    ):
        table = await resp.json()
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    cells = table["rows"][0]["cells"]
    assert cells[:4] == ["jupyter-alice", "1/1", "Running", 0]
    assert cells[6] == "gpu-node-03"
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


async def test_event_tables_show_what_happened_to_which_object(
    sim_server: testing.RunningSim,
) -> None:
    sim_server.store.create(
        "events",
        {
            "metadata": {"name": "gpu-node-01.1", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": "gpu-node-01"},
            "reason": "Cordoned",
            "message": "cordoned by remediator",
            "type": "Normal",
        },
    )
    headers = {**sim_server.headers, "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(f"{sim_server.url}/api/v1/namespaces/default/events") as resp,
    ):
        table = await resp.json()
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Last Seen",
        "Type",
        "Reason",
        "Object",
        "Message",
    ]
    assert table["rows"][0]["cells"][1:] == [
        "Normal",
        "Cordoned",
        "node/gpu-node-01",
        "cordoned by remediator",
    ]
