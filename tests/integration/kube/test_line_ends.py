"""Names with a line end ("gpu-node-01\\n") never reach the API server: a regex anchored with
``$`` under ``re.match`` would let them through, and the cluster would answer for another name
(a pod "name\\n" is not found, so its eviction looked done)."""

from __future__ import annotations

import pydantic
import pytest

from remediator.actions import kube, pods, taints
from remediator.domain import errors
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, node_events, run_action

LINE_ENDS = ["\n", "\r"]


@pytest.mark.parametrize("end", LINE_ENDS)
async def test_a_run_node_with_a_line_end_is_refused_before_any_call(
    sim: testing.RunningSim, make_ctx: MakeContext, end: str
) -> None:
    with pytest.raises(errors.ActionFailed, match=r"refused: .*not a valid DNS-1123") as caught:
        await run_action(kube.CordonAction(), make_ctx(node="gpu-node-01" + end), {})
    assert not caught.value.temporary
    assert not sim.node("gpu-node-01")["spec"].get("unschedulable")
    assert node_events(sim, "gpu-node-01") == []


@pytest.mark.parametrize("end", LINE_ENDS)
async def test_label_and_taint_values_with_a_line_end_never_reach_the_node(
    sim: testing.RunningSim, make_ctx: MakeContext, end: str
) -> None:
    before = sim.node("gpu-node-01")
    with pytest.raises(pydantic.ValidationError, match="not a valid label value"):
        await run_action(kube.LabelAction(), make_ctx(), {"labels": {"gpu-status": "ok" + end}})
    with pytest.raises(pydantic.ValidationError, match="not a valid label value"):
        await run_action(
            taints.TaintAction(), make_ctx(), {"taints": [{"key": "gpu", "value": "ok" + end}]}
        )
    assert sim.node("gpu-node-01") == before


@pytest.mark.parametrize("end", LINE_ENDS)
async def test_evicting_a_pod_name_with_a_line_end_is_refused_not_reported_gone(
    sim: testing.RunningSim, make_ctx: MakeContext, end: str
) -> None:
    pod = sim.pods(node="gpu-node-01")[0]["metadata"]
    namespace, name = pod["namespace"], pod["name"]
    with pytest.raises(pydantic.ValidationError, match="not a valid DNS-1123 subdomain"):
        await run_action(
            pods.EvictAction(), make_ctx(), {"namespace": namespace, "pod": name + end}
        )
    assert sim.pod(namespace, name) is not None
