"""Params models reject hostile values from alerts before any call is made."""

from __future__ import annotations

import pydantic
import pytest

from remediator.actions import drain, gpu, kube, pods, taints

HOSTILE = [
    "x; rm -rf /",
    "$(reboot)",
    "`id`",
    "gpu-node-01\nx",
    "../etc",
    "GPU-NODE-01",
    "nöde-01",
    "a" * 254,
    "-leading-dash",
    "",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_node_names_are_rejected(name: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        kube.CordonAction().parse({"node": name})


@pytest.mark.parametrize(
    "value", ["x; rm -rf /", "$(reboot)", "ünïcode", "a" * 64, "-x", "x-", "a b"]
)
def test_hostile_label_values_are_rejected(value: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        kube.LabelAction().parse({"labels": {"gpu-status": value}})


@pytest.mark.parametrize(
    "key", ["$(reboot)", "a/b/c", "/x", "Example.com/x", "x" * 64, "ok.io/" + "x" * 64, ""]
)
def test_invalid_label_keys_are_rejected(key: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        kube.LabelAction().parse({"labels": {key: "v"}})


def test_valid_kubernetes_names_and_labels_pass() -> None:
    params = kube.LabelAction().parse(
        {"node": "gpu-node-01.example.com", "labels": {"nvidia.com/gpu.present": "", "a_b": "Z.9"}}
    )
    assert params.node == "gpu-node-01.example.com"


def test_unknown_params_are_rejected() -> None:
    with pytest.raises(pydantic.ValidationError):
        kube.CordonAction().parse({"node": "gpu-node-01", "shell": "true"})


@pytest.mark.parametrize("namespace", ["kube_system", "a.b", "x" * 64, "$(id)"])
def test_pod_actions_reject_bad_namespaces(namespace: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        pods.EvictAction().parse({"namespace": namespace, "pod": "p"})


def test_taint_effects_are_a_closed_set() -> None:
    with pytest.raises(pydantic.ValidationError):
        taints.TaintAction().parse({"taints": [{"key": "k", "effect": "Evict"}]})


@pytest.mark.parametrize("ident", ["0; reboot", "GPU-xyz", "-1", "all,1"])
def test_gpu_identifiers_must_be_an_index_uuid_or_bus_id(ident: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        gpu.PowerCapAction().parse({"watts": 300, "gpus": [ident]})


def test_power_cap_needs_exactly_one_target() -> None:
    with pytest.raises(pydantic.ValidationError):
        gpu.PowerCapAction().parse({})
    with pytest.raises(pydantic.ValidationError):
        gpu.PowerCapAction().parse({"watts": 300, "percent_of_default": 50})


def test_drain_pod_selector_rejects_shell_metacharacters() -> None:
    with pytest.raises(pydantic.ValidationError):
        drain.DrainAction().parse({"pod_selector": "app=x;reboot"})


def test_every_kube_action_is_exported_once() -> None:
    names = [a.name for a in kube.KUBE_ACTIONS]
    assert len(names) == len(set(names)) == 13
    assert {a.name for a in kube.KUBE_ACTIONS if a.disruptive} == {
        "gpu.drain_workloads",
        "node.cordon",
        "node.drain",
        "node.taint",
        "pod.evict",
    }


# ``re.match(r"^...$")`` lets a final "\n" through: ``$`` matches just before it.
LINE_ENDS = ["\n", "\r", "\r\n"]


def _refused(action, params, field):
    with pytest.raises(pydantic.ValidationError) as caught:
        action.parse(params)
    found = caught.value.errors(include_url=False)
    messages = [e["msg"] for e in found if field in ".".join(map(str, e["loc"]))]
    assert messages, found
    return " ".join(messages)


@pytest.mark.parametrize("end", LINE_ENDS)
def test_a_node_name_with_a_line_end_is_refused(end: str) -> None:
    message = _refused(kube.CordonAction(), {"node": "gpu-node-01" + end}, "node")
    assert "not a valid DNS-1123 subdomain name" in message


@pytest.mark.parametrize("end", LINE_ENDS)
def test_label_keys_and_values_with_a_line_end_are_refused(end: str) -> None:
    message = _refused(kube.LabelAction(), {"labels": {"gpu-status": "ok" + end}}, "gpu-status")
    assert "not a valid label value" in message
    message = _refused(kube.LabelAction(), {"labels": {"gpu-status" + end: "ok"}}, "labels")
    assert "not a valid label key" in message
    message = _refused(kube.LabelAction(), {"labels": {"ok.io" + end + "/x": "ok"}}, "labels")
    assert "the prefix must be a DNS-1123 subdomain" in message


@pytest.mark.parametrize("end", LINE_ENDS)
def test_taint_keys_and_values_with_a_line_end_are_refused(end: str) -> None:
    taint = taints.TaintAction()
    message = _refused(taint, {"taints": [{"key": "k", "value": "ok" + end}]}, "taints.0.value")
    assert "not a valid label value" in message
    message = _refused(taint, {"taints": [{"key": "k" + end}]}, "taints.0.key")
    assert "not a valid label key" in message


@pytest.mark.parametrize("end", LINE_ENDS)
def test_pod_names_and_namespaces_with_a_line_end_are_refused(end: str) -> None:
    evict = pods.EvictAction()
    message = _refused(evict, {"namespace": "default", "pod": "name" + end}, "pod")
    assert "not a valid DNS-1123 subdomain name" in message
    message = _refused(evict, {"namespace": "default" + end, "pod": "name"}, "namespace")
    assert "not a valid DNS-1123 label" in message


@pytest.mark.parametrize("end", LINE_ENDS)
def test_gpu_ids_selectors_and_event_reasons_with_a_line_end_are_refused(end: str) -> None:
    _refused(gpu.PowerCapAction(), {"watts": 300, "gpus": ["0" + end]}, "gpus")
    _refused(drain.DrainAction(), {"pod_selector": "app=x" + end}, "pod_selector")
    _refused(pods.EventAction(), {"reason": "GpuLost" + end, "message": "m"}, "reason")
