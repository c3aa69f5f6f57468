"""The simulator's copy of a stored object: independent containers, the same values."""

from __future__ import annotations

import copy

from remediator.sim import objects, store, values


def test_a_clone_equals_its_source_and_shares_no_container() -> None:
    source = {"metadata": {"labels": {"a": "1"}}, "spec": {"taints": [{"key": "k"}]}, "n": 3}
    cloned = values.clone(source)
    assert cloned == source == copy.deepcopy(source)
    cloned["metadata"]["labels"]["a"] = "2"
    cloned["spec"]["taints"][0]["key"] = "changed"
    cloned["spec"]["taints"].append({"key": "new"})
    assert source == {
        "metadata": {"labels": {"a": "1"}},
        "spec": {"taints": [{"key": "k"}]},
        "n": 3,
    }


def test_a_read_object_can_be_changed_without_changing_the_store() -> None:
    st = store.Store()
    node = objects.node(
        "gpu-1",
        labels={"pool": "a"},
        taints=[],
        allocatable={"nvidia.com/gpu": "8"},
        unschedulable=False,
    )
    st.create("nodes", node)
    read = st.must_get("nodes", "", "gpu-1")
    read["metadata"]["labels"]["pool"] = "b"
    read["status"]["conditions"].clear()
    again = st.must_get("nodes", "", "gpu-1")
    assert again["metadata"]["labels"]["pool"] == "a"
    assert again["status"]["conditions"]
    assert st.history[-1].obj["metadata"]["labels"]["pool"] == "a"
