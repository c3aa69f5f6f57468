"""Input that could never be stored is refused at the door (400 naming the field, never 503),
so it can neither make Alertmanager retry forever nor fail every engine pass after it; and an
engine pass that fails anyway never ends the loop and shows in ``/readyz`` and ``/metrics``.
On SQLite and Postgres (Postgres refuses a string longer than its column; SQLite stores it)."""

from __future__ import annotations

import asyncio
import inspect
import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from remediator.domain import alerts
from remediator.engine import operations
from remediator.sim import testing
from tests.integration.operators.conftest import TOKENS, write_tokens
from tests.support.alerts import alert_body

RECORD = """
name: record
match: {alertname: [GPUXidError79, GPUTemperatureHigh]}
exclusive: false
steps:
  - {id: rec, action: test.record, params: {label: "{{ target.node }}"}}
"""


async def _episodes(h):
    response = await h.client.get("/api/v1/alerts", params={"limit": "500"})
    assert response.status == 200
    return (await response.json())["items"]


async def _refused(response, field):
    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == "unstorable"
    assert "whole delivery" in error["message"]
    assert field in [f["field"] for f in error["fields"]], error
    return error


async def _a_normal_alert_still_gets_its_run(h):
    assert await _episodes(h) == []
    response = await h.post(alert_body(node="gpu-node-07"))
    assert response.status == 200, await response.text()
    await h.settle()
    [run] = await h.runs()
    assert (run["node"], run["status"]) == ("gpu-node-07", "succeeded")


async def test_a_node_label_too_long_for_its_column_is_refused_and_stores_nothing(make_harness):
    h = await make_harness(RECORD)
    response = await h.post(alert_body(node="n" * 300))
    error = await _refused(response, "alerts.0.labels.node")
    assert "at most 253" in error["fields"][0]["message"]
    await _a_normal_alert_still_gets_its_run(h)


async def test_an_alertname_too_long_for_its_column_gets_400_not_503(make_harness):
    h = await make_harness(RECORD)
    response = await h.post(alert_body(alertname="A" * 300))
    await _refused(response, "alerts.0.labels.alertname")
    await _a_normal_alert_still_gets_its_run(h)


async def test_a_gpu_label_too_long_for_its_column_is_refused(make_harness):
    h = await make_harness(RECORD)
    response = await h.post(alert_body(gpu="GPU-" + "f" * 125))
    await _refused(response, "alerts.0.labels.UUID")
    await _a_normal_alert_still_gets_its_run(h)


@pytest.mark.parametrize(
    ("where", "name", "size", "field"),
    [
        ("labels", "pci_bus_id", 4097, "alerts.0.labels.pci_bus_id"),
        ("annotations", "description", 32769, "alerts.0.annotations.description"),
        ("labels", "n" * 300, 1, "alerts.0.labels." + "n" * 40 + "…"),
    ],
)
async def test_oversized_labels_and_annotations_are_refused(make_harness, where, name, size, field):
    h = await make_harness(RECORD)
    raw = json.loads(alert_body())
    raw["alerts"][0][where][name] = "x" * size
    await _refused(await h.post(json.dumps(raw).encode()), field)
    await _a_normal_alert_still_gets_its_run(h)


async def test_one_unstorable_alert_refuses_its_whole_group(make_harness):
    """Alertmanager cannot re-send part of a group: 200 would mean all of it is stored."""
    h = await make_harness(RECORD)
    raw = json.loads(alert_body(node="gpu-node-01"))
    bad = json.loads(json.dumps(raw["alerts"][0]))
    bad["labels"]["node"] = "n" * 300
    bad["fingerprint"] = "00000000000000bd"
    raw["alerts"].append(bad)
    error = await _refused(await h.post(json.dumps(raw).encode()), "alerts.1.labels.node")
    assert "(2 alert(s))" in error["message"]
    await _a_normal_alert_still_gets_its_run(h)
    text = await (await h.client.get("/metrics")).text()
    assert 'remediator_deliveries_rejected_total{reason="unstorable"} 1.0' in text


async def test_a_short_node_label_that_is_no_node_name_poisons_nothing(make_harness):
    """Stored, and the run records it; only the Kubernetes actions would refuse it."""
    h = await make_harness(RECORD)
    response = await h.post(alert_body(node="GPU Node 01\n", alertname="GPUTemperatureHigh"))
    assert response.status == 200, await response.text()
    await h.settle()
    assert [r["node"] for r in await h.runs()] == ["GPU Node 01\n"]
    assert (await h.post(alert_body(node="gpu-node-07"))).status == 200
    await h.settle()
    assert sorted(r["node"] for r in await h.runs()) == ["GPU Node 01\n", "gpu-node-07"]


async def test_a_value_the_database_refuses_gets_400_not_503_and_fails_alone(
    make_harness, monkeypatch
):
    """Should intake ever allow more than a column holds, Postgres's refusal is still final,
    and deliveries written in the same transaction are written without it."""
    h = await make_harness(RECORD)
    if not h.components.db.is_postgres:
        pytest.skip("SQLite stores strings of any length")
    monkeypatch.setattr(alerts, "MAX_ALERTNAME", 10_000)
    bad = h.post(alert_body(alertname="A" * 300))
    good = [h.post(alert_body(node=f"gpu-node-{i:02d}")) for i in range(5)]
    refused, *accepted = await asyncio.gather(bad, *good)
    error = await _refused(refused, "(body)")
    assert "value too long" in error["fields"][0]["message"]
    assert [response.status for response in accepted] == [200] * 5
    await h.settle()
    assert len(await h.runs()) == 5


BY_HAND = """
name: by-hand
manual: true
target: {require_node: false}
parameters:
  node: {type: string}
steps:
  - {id: rec, action: test.record, params: {label: by-hand}}
"""


async def test_a_run_the_database_refuses_gets_400_not_503(make_harness, monkeypatch):
    """Should the API ever pass a node longer than ``runs.node`` holds, Postgres's refusal is
    still final: a 400 naming the problem, not a 503 that invites the caller to retry."""
    h = await make_harness(BY_HAND)
    if not h.components.db.is_postgres:
        pytest.skip("SQLite stores strings of any length")
    monkeypatch.setattr(operations, "NODE_NAME", r"[a-z]+")
    url = "/api/v1/runbooks/by-hand/runs"
    response = await h.client.post(url, json={"params": {"node": "n" * 300}})
    assert response.status == 400, await response.text()
    assert "Retry-After" not in response.headers
    error = (await response.json())["error"]
    assert error["code"] == "invalid"
    assert "the database refuses a value" in error["message"]
    assert "value too long" in error["message"]
    assert await h.runs() == []
    response = await h.client.post(url, json={"params": {"node": "gpunode"}})
    assert response.status == 201, await response.text()


async def test_a_node_typed_into_the_runbook_form_that_is_no_node_name_is_refused(
    make_harness, tmp_path
):
    """The form's node is free text: checked like the API's, before anything is stored."""
    h = await make_harness(BY_HAND, tokens=write_tokens(tmp_path))
    login = await h.client.get("/runbooks/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', await login.text()).group(1)
    signed = await h.client.post(
        "/runbooks/login",
        data={"token": TOKENS["olivia"][0], "csrf": nonce},
        allow_redirects=False,
    )
    assert signed.status == 303
    page = await (await h.client.get("/runbooks")).text()
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    for node in ("n" * 300, "GPU Node 01", "gpu-node-01\rx"):
        response = await h.client.post(
            "/runbooks/by-hand/trigger", data={"csrf": csrf, "node": node}, allow_redirects=False
        )
        assert response.status == 400, (node, response.status)
        assert "is not a Kubernetes node name" in await response.text()
    assert await h.runs() == []


@pytest.fixture
async def sim():
    async with testing.running_sim(time_scale=0.01) as running:
        yield running


def _on(sim):
    kubernetes = {"mode": "url", "url": sim.url, "token": sim.token, "retry_max_seconds": 5.0}
    return {"kubernetes": kubernetes, "guards": {"max_percent": 50.0}}


def _acting(step):
    return f"""
name: act
match: {{alertname: GPUXidError79}}
exclusive: false
steps:
  - {step}
"""


LINE_ENDS = ["\n", "\r"]


@pytest.mark.parametrize("end", LINE_ENDS)
async def test_a_node_label_with_a_line_end_is_stored_but_never_reaches_the_cluster(
    make_harness, sim, end
):
    """Stored like any short node label; targeting never looks it up (nor a trimmed copy of
    it), so the run fails at planning, naming the labels it tried, before any cluster call."""
    h = await make_harness(_acting("{id: cordon, action: node.cordon}"), **_on(sim))
    response = await h.post(alert_body(node="gpu-node-01" + end))
    assert response.status == 200, await response.text()
    await h.settle()
    [run] = await h.runs()
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "failed"
    assert all(step["status"] != "succeeded" for step in detail["steps"])
    assert "node" in detail["reason"], detail["reason"]
    assert not sim.node("gpu-node-01")["spec"].get("unschedulable")


EVICT = '{id: evict, action: pod.evict, params: {namespace: ml-training, pod: "{{ labels.pod }}"}}'
LABEL = '{id: label, action: node.label, params: {labels: {gpu-status: "{{ labels.state }}"}}}'
TAINT = (
    '{id: taint, action: node.taint, params: {taints: [{key: gpu, value: "{{ labels.state }}"}]}}'
)


@pytest.mark.parametrize("end", LINE_ENDS)
@pytest.mark.parametrize(
    ("step", "label", "value", "field"),
    [
        (EVICT, "pod", "llama-finetune-0", "pod"),
        (LABEL, "state", "ok", "labels.gpu-status"),
        (TAINT, "state", "ok", "taints.0.value"),
    ],
    ids=["pod name", "label value", "taint value"],
)
async def test_a_label_with_a_line_end_fails_the_run_at_planning_naming_the_param(
    make_harness, sim, step, label, value, field, end
):
    """A pod "name\\n" is not found, so its eviction was once recorded as done: now the run is
    failed before it starts, its reason naming the param, and the cluster is untouched."""
    h = await make_harness(_acting(step), **_on(sim))
    node = sim.node("gpu-node-01")
    response = await h.post(alert_body(node="gpu-node-01", extra_labels={label: value + end}))
    assert response.status == 200, await response.text()
    await h.settle()
    [run] = await h.runs()
    assert run["status"] == "failed"
    assert f"invalid params: {field}: Value error, {value + end!r}" in run["reason"]
    assert sim.node("gpu-node-01") == node
    assert sim.pod("ml-training", "llama-finetune-0") is not None


async def _until(predicate, timeout=10.0):
    async with asyncio.timeout(timeout):
        while True:
            result = predicate()
            if await result if inspect.isawaitable(result) else result:
                return
            await asyncio.sleep(0.01)


async def _ready(h):
    response = await h.client.get("/readyz")
    return response.status, (await response.json())["checks"]["engine"]


@pytest.fixture
async def failing_engine(make_harness, monkeypatch):
    """The app with its engine loop running, and a switch that makes every pass raise."""
    h = await make_harness(RECORD, poll_interval=0.01)
    tick = h.engine.tick
    h.failing = True

    async def failing_tick():
        if h.failing:
            raise KeyError("a bug in some pass")
        return await tick()

    monkeypatch.setattr(h.engine, "tick", failing_tick)
    task = asyncio.create_task(h.engine.run_forever())
    yield h
    await h.engine.stop()
    await task


async def test_failing_passes_never_end_the_engine_loop_and_flip_readiness_until_one_completes(
    failing_engine, clock
):
    h = failing_engine
    metrics = h.components.metrics

    await _until(lambda: metrics.failing.count >= 5)
    status, engine = await _ready(h)
    assert status == 503
    assert engine.startswith("stalled: ")
    assert "(last: KeyError)" in engine
    text = await (await h.client.get("/metrics")).text()
    assert "remediator_engine_last_success_timestamp_seconds 0.0" in text
    assert 'remediator_engine_pass_failures_total{reason="store_unavailable"} 0.0' in text

    h.failing = False
    assert (await h.post(alert_body(node="gpu-node-07"))).status == 200

    async def ran():
        return [r["status"] for r in await h.runs()] == ["succeeded"]

    await _until(ran)
    assert await _ready(h) == (200, "ok")
    samples = await _scrape(h)
    assert samples['remediator_engine_pass_failures_total{reason="error"}'] >= 5
    assert samples["remediator_engine_consecutive_pass_failures"] == 0
    assert samples["remediator_engine_last_success_timestamp_seconds"] == clock.now.timestamp()


async def test_readiness_flips_when_failing_passes_last_a_minute_however_few(
    make_harness, monkeypatch, clock
):
    h = await make_harness(RECORD, poll_interval=3600.0)  # one pass, then only when woken
    failures = []

    async def failing_tick():
        failures.append(clock.now)
        raise RuntimeError("slow and failing")

    monkeypatch.setattr(h.engine, "tick", failing_tick)
    task = asyncio.create_task(h.engine.run_forever())
    try:
        await _until(lambda: h.components.metrics.failing.count == 1)
        status, engine = await _ready(h)
        assert status == 200
        assert engine.startswith("failing: 1 pass(es)")
        clock.advance(60)
        status, engine = await _ready(h)
        assert status == 503
        assert engine.startswith("stalled: 1 pass(es)")
        monkeypatch.undo()
        h.engine.wake()
        await _until(lambda: h.components.metrics.failing.count == 0)
        assert await _ready(h) == (200, "ok")
    finally:
        await h.engine.stop()
        await task
    assert len(failures) == 1


async def _scrape(h):
    text = await (await h.client.get("/metrics")).text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples
