"""Evictions honour PodDisruptionBudgets; controllers replace evicted pods on schedulable nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from remediator.sim import testing


def eviction(name: str, namespace: str, grace: int | None = None) -> client.V1Eviction:
    return client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        delete_options=client.V1DeleteOptions(grace_period_seconds=grace),
    )


def pdb(
    name: str, namespace: str, labels: dict[str, str], **spec: Any
) -> client.V1PodDisruptionBudget:
    return client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1PodDisruptionBudgetSpec(
            selector=client.V1LabelSelector(match_labels=labels), **spec
        ),
    )


async def test_seeded_budgets_report_their_status(policy: client.PolicyV1Api) -> None:
    training = await policy.read_namespaced_pod_disruption_budget("llama-finetune", "ml-training")
    assert training.status.expected_pods == 2
    assert training.status.current_healthy == 2
    assert training.status.desired_healthy == 1
    assert training.status.disruptions_allowed == 1
    inference = await policy.read_namespaced_pod_disruption_budget("vllm-llama3-70b", "inference")
    assert inference.status.desired_healthy == 1
    assert inference.status.conditions[0].type == "DisruptionAllowed"


async def test_percentages_are_scaled_against_the_controller_replicas(
    policy: client.PolicyV1Api,
    sim_server: testing.RunningSim,
) -> None:
    await policy.create_namespaced_pod_disruption_budget(
        "monitoring", pdb("dash", "monitoring", {"app": "dashboard"}, max_unavailable="50%")
    )
    status = (await policy.read_namespaced_pod_disruption_budget("dash", "monitoring")).status
    assert (status.expected_pods, status.desired_healthy, status.disruptions_allowed) == (2, 1, 1)
    await policy.delete_namespaced_pod_disruption_budget("dash", "monitoring")
    await policy.create_namespaced_pod_disruption_budget(
        "monitoring", pdb("dash", "monitoring", {"app": "dashboard"}, min_available="100%")
    )
    status = (await policy.read_namespaced_pod_disruption_budget("dash", "monitoring")).status
    assert (status.desired_healthy, status.disruptions_allowed) == (2, 0)
    listed = await policy.list_pod_disruption_budget_for_all_namespaces()
    assert {p.metadata.name for p in listed.items} == {"dash", "llama-finetune", "vllm-llama3-70b"}


async def test_a_budget_with_no_disruptions_left_blocks_eviction_with_429(
    core: client.CoreV1Api,
    policy: client.PolicyV1Api,
) -> None:
    await policy.patch_namespaced_pod_disruption_budget(
        "llama-finetune",
        "ml-training",
        {"spec": {"minAvailable": 2}},
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(ApiException) as info:
        await core.create_namespaced_pod_eviction(
            "llama-finetune-0", "ml-training", eviction("llama-finetune-0", "ml-training")
        )
    assert info.value.status == 429
    assert json.loads(info.value.body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": (
                        "The disruption budget llama-finetune needs 2 healthy pods and has "
                        "2 currently"
                    ),
                }
            ]
        },
        "code": 429,
    }
    pod = await core.read_namespaced_pod("llama-finetune-0", "ml-training")
    assert pod.metadata.deletion_timestamp is None


async def test_two_budgets_selecting_a_pod_make_eviction_fail_with_500(
    core: client.CoreV1Api,
    policy: client.PolicyV1Api,
) -> None:
    await policy.create_namespaced_pod_disruption_budget(
        "inference", pdb("second", "inference", {"app": "vllm-llama3-70b"}, min_available=0)
    )
    with pytest.raises(ApiException) as info:
        await core.create_namespaced_pod_eviction(
            "vllm-llama3-70b-7c9d5", "inference", eviction("vllm-llama3-70b-7c9d5", "inference")
        )
    assert info.value.status == 500
    body = json.loads(info.value.body)
    assert body["message"] == (
        "Internal error occurred: This pod has more than one PodDisruptionBudget, which the "
        "eviction subresource does not support."
    )


async def test_evicting_a_missing_pod_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as info:
        await core.create_namespaced_pod_eviction(
            "gone", "inference", eviction("gone", "inference")
        )
    assert info.value.status == 404
    assert json.loads(info.value.body)["message"] == 'pods "gone" not found'


async def test_evicted_replicaset_pod_is_replaced_on_a_schedulable_node(
    core: client.CoreV1Api,
    sim_server: testing.RunningSim,
) -> None:
    for node in ("gpu-node-01", "gpu-node-03"):
        await core.patch_node(node, {"spec": {"unschedulable": True}})
    await core.create_namespaced_pod_eviction(
        "vllm-llama3-70b-7c9d5", "inference", eviction("vllm-llama3-70b-7c9d5", "inference")
    )
    pod = await core.read_namespaced_pod("vllm-llama3-70b-7c9d5", "inference")
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 30

    def replaced() -> bool:
        pods = sim_server.pods(namespace="inference")
        names = {p["metadata"]["name"] for p in pods}
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return "vllm-llama3-70b-7c9d5" not in names and len(running) == 2

    await sim_server.wait_for(replaced)
    nodes = {p["spec"]["nodeName"] for p in sim_server.pods(namespace="inference")}
    assert nodes <= {"gpu-node-02", "gpu-node-04"}


async def test_a_replacement_that_fits_nowhere_stays_pending(
    core: client.CoreV1Api,
    sim_server: testing.RunningSim,
) -> None:
    for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"):
        await core.patch_node(node, {"spec": {"unschedulable": True}})
    await core.create_namespaced_pod_eviction(
        "llama-finetune-0", "ml-training", eviction("llama-finetune-0", "ml-training", grace=1)
    )

    def pending() -> bool:
        pod = sim_server.pod("ml-training", "llama-finetune-0")
        return (
            pod is not None
            and not pod["spec"].get("nodeName")
            and bool(pod["status"].get("conditions"))
        )

    await sim_server.wait_for(pending)
    pod = await core.read_namespaced_pod("llama-finetune-0", "ml-training")
    assert pod.status.phase == "Pending"
    condition = pod.status.conditions[0]
    assert (condition.type, condition.reason) == ("PodScheduled", "Unschedulable")
    assert "4 node(s) were unschedulable" in condition.message
    assert "untolerated taint" not in condition.message or "1 node(s)" in condition.message
    await core.patch_node("gpu-node-03", {"spec": {"unschedulable": False}})

    def running_on_03() -> bool:
        pod = sim_server.pod("ml-training", "llama-finetune-0")
        return (
            pod is not None
            and pod["spec"].get("nodeName") == "gpu-node-03"
            and pod["status"].get("phase") == "Running"
        )

    await sim_server.wait_for(running_on_03)


async def test_pods_without_gpus_avoid_tainted_gpu_nodes(
    core: client.CoreV1Api,
    sim_server: testing.RunningSim,
) -> None:
    await core.patch_node("cpu-node-01", {"spec": {"unschedulable": True}})
    await core.delete_namespaced_pod("dashboard-6d4cf-h2mzq", "monitoring", grace_period_seconds=0)

    def pending_replacement() -> bool:
        pods = sim_server.pods(namespace="monitoring")
        return len(pods) == 2 and any(
            not p["spec"].get("nodeName") and p["status"].get("conditions") for p in pods
        )

    await sim_server.wait_for(pending_replacement)
    pending = next(
        p for p in sim_server.pods(namespace="monitoring") if not p["spec"].get("nodeName")
    )
    message = pending["status"]["conditions"][0]["message"]
    assert "4 node(s) had untolerated taint {nvidia.com/gpu: present}" in message


async def test_daemonset_pods_come_back_on_their_own_node(
    core: client.CoreV1Api,
    sim_server: testing.RunningSim,
) -> None:
    await core.patch_node("gpu-node-02", {"spec": {"unschedulable": True}})
    driver = sim_server.driver_pod("gpu-node-02")
    await core.delete_namespaced_pod(driver["metadata"]["name"], "gpu-operator")

    def recreated() -> bool:
        try:
            pod = sim_server.driver_pod("gpu-node-02")
        except KeyError:
            return False
        return (
            pod["metadata"]["uid"] != driver["metadata"]["uid"]
            and pod["status"].get("phase") == "Running"
        )

    await sim_server.wait_for(recreated)


async def test_pending_and_terminating_pods_skip_the_budget_check(
    core: client.CoreV1Api,
    policy: client.PolicyV1Api,
    sim_server: testing.RunningSim,
) -> None:
    await policy.patch_namespaced_pod_disruption_budget(
        "llama-finetune",
        "ml-training",
        {"spec": {"minAvailable": 2}},
        _content_type="application/merge-patch+json",
    )
    await core.delete_namespaced_pod("llama-finetune-1", "ml-training")
    # terminating: no budget check, eviction succeeds
    response = await core.create_namespaced_pod_eviction(
        "llama-finetune-1",
        "ml-training",
        eviction("llama-finetune-1", "ml-training"),
        _preload_content=False,
    )
    assert response.status == 201
    assert json.loads(await response.read()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }


async def test_dry_run_eviction_checks_the_budget_without_deleting(
    sim_server: testing.RunningSim,
    core: client.CoreV1Api,
) -> None:
    await core.create_namespaced_pod_eviction(
        "vllm-llama3-70b-7c9d5",
        "inference",
        eviction("vllm-llama3-70b-7c9d5", "inference"),
        dry_run="All",
    )
    pod = sim_server.pod("inference", "vllm-llama3-70b-7c9d5")
    assert pod is not None
    assert "deletionTimestamp" not in pod["metadata"]


async def test_policy_v1beta1_eviction_is_served_too(sim_server: testing.RunningSim) -> None:
    import aiohttp

    body = {
        "apiVersion": "policy/v1beta1",
        "kind": "Eviction",
        "metadata": {"name": "dashboard-6d4cf-t7wvx", "namespace": "monitoring"},
    }
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:
        url = f"{sim_server.url}/api/v1/namespaces/monitoring/pods/dashboard-6d4cf-t7wvx/eviction"
        async with http.post(url, json=body) as resp:
            assert resp.status == 201
        async with http.get(
            f"{sim_server.url}/apis/policy/v1beta1/namespaces/inference/"
            "poddisruptionbudgets/vllm-llama3-70b"
        ) as resp:
            assert (await resp.json())["apiVersion"] == "policy/v1beta1"
