"""Reading the kubelet's device checkpoint and the alert's workload labels (pure)."""

from __future__ import annotations

import json

import pytest

from remediator.actions import gpudrain
from remediator.sim import cluster as cluster_mod
from remediator.sim import fleet, kubelet, persist

UUID_3 = "GPU-e9515ed6-254d-5ed7-8e04-aea9cc21a64f"


def test_both_checkpoint_formats_give_each_pods_gpus() -> None:
    numa = {  # kubelet 1.20+: DeviceIDs keyed by NUMA node
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": "a", "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"0": [UUID_3]}},
                {"PodUID": "b", "ResourceName": "example.com/nic", "DeviceIDs": {"0": ["x"]}},
            ],
            "RegisteredDevices": {"nvidia.com/gpu": [UUID_3], "example.com/nic": ["x"]},
        },
        "Checksum": 1,
    }
    assert gpudrain.parse_checkpoint(json.dumps(numa)) == ({UUID_3}, {"a": {UUID_3}})
    flat = {  # before 1.20: a plain list
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": "c", "ResourceName": "nvidia.com/gpu", "DeviceIDs": ["3", "4"]}
            ],
            "RegisteredDevices": {"nvidia.com/gpu": ["3", "4"]},
        }
    }
    assert gpudrain.parse_checkpoint(json.dumps(flat)) == ({"3", "4"}, {"c": {"3", "4"}})
    with pytest.raises(gpudrain.Unknown, match="cannot be parsed"):
        gpudrain.parse_checkpoint("<html>not the checkpoint</html>")
    with pytest.raises(gpudrain.Unknown, match="cannot be parsed"):
        gpudrain.parse_checkpoint(
            '{"Data": {"PodDeviceEntries": [{"ResourceName": "nvidia.com/gpu"}]}}'
        )


def test_the_exported_pod_labels_win_over_the_exporters_own() -> None:
    labels = {
        "namespace": "gpu-operator",
        "pod": "nvidia-dcgm-exporter-7xk2p",
        "exported_namespace": "research",
        "exported_pod": "jupyter-alice",
    }
    assert gpudrain.alert_workload(labels) == ("research/jupyter-alice", "")
    assert gpudrain.alert_workload({"namespace": "a", "pod": "b"}) == ("a/b", "")
    assert gpudrain.alert_workload({"Hostname": "gpu-node-01"})[0] is None
    named, why = gpudrain.alert_workload({"namespace": "A b", "pod": "x"})
    assert named is None
    assert "not a pod name" in why


def test_the_simulated_kubelet_keeps_each_pods_gpus_across_a_state_file() -> None:
    first = cluster_mod.Cluster(fleet.Fleet.default())
    assert kubelet.holders(first, "gpu-node-03", 3) == ["research/jupyter-alice"]
    assert kubelet.holders(first, "gpu-node-03", 0) == []
    second = cluster_mod.Cluster(fleet.Fleet.default())
    second.device_allocations.clear()
    persist.restore(second, json.loads(json.dumps(persist.snapshot(first))))
    assert kubelet.holders(second, "gpu-node-03", 3) == ["research/jupyter-alice"]
