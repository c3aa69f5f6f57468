"""The patch flavours and selector parsing, as pure functions."""

from __future__ import annotations

import copy

import pytest

from remediator.sim import errors, patching, selectors

NODE = {
    "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "DiskPressure", "status": "False"},
        ]
    },
}


def test_strategic_merge_merges_lists_with_a_merge_key_and_replaces_atomic_ones() -> None:
    patch = {
        "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "DiskPressure"}],
            "conditions": [{"type": "Ready", "status": "False"}],
        },
        "spec": {"taints": [{"key": "new", "effect": "NoExecute"}]},
        "metadata": {"labels": {"a": None, "c": "3"}},
    }
    result = patching.apply_patch(NODE, patch, patching.STRATEGIC)
    assert result["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "DiskPressure", "status": "False"},
    ]
    assert result["spec"]["taints"] == [{"key": "new", "effect": "NoExecute"}]
    assert result["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert NODE["metadata"]["labels"] == {"a": "1", "b": "2"}  # input untouched


def test_strategic_merge_directives_delete_and_replace() -> None:
    deleted = patching.strategic_merge(
        NODE, {"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}
    )
    assert [c["type"] for c in deleted["status"]["conditions"]] == ["DiskPressure"]
    replaced = patching.strategic_merge(
        NODE, {"metadata": {"labels": {"z": "9", "$patch": "replace"}}}
    )
    assert replaced["metadata"]["labels"] == {"z": "9"}
    primitive = patching.strategic_merge(
        NODE, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}
    )
    assert primitive["metadata"]["finalizers"] == []


def test_merge_patch_replaces_lists_and_removes_nulls() -> None:
    result = patching.apply_patch(
        NODE, {"spec": {"taints": None}, "metadata": {"labels": {"b": None}}}, patching.MERGE
    )
    assert "taints" not in result["spec"]
    assert result["metadata"]["labels"] == {"a": "1"}


@pytest.mark.parametrize(
    ("ctype", "patch"),
    [
        (patching.MERGE, {"metadata": {"labels": {"a": None, "c": {"deep": ["v"]}}}}),
        (
            patching.STRATEGIC,
            {
                "metadata": {"labels": {"a": None, "c": {"deep": ["v"]}}},
                "status": {"conditions": [{"type": "Ready", "status": "False", "x": ["v"]}]},
            },
        ),
        (patching.JSON_PATCH, [{"op": "add", "path": "/metadata/labels/c", "value": ["v"]}]),
    ],
)
def test_a_patch_leaves_its_target_and_body_alone_and_its_result_shares_no_body_value(
    ctype: str, patch: object
) -> None:
    """A patch changes neither its target nor its body. Its result may share what the patch
    did not touch with the target (the store copies what it keeps), never a body's value."""
    target = copy.deepcopy(NODE)
    body = copy.deepcopy(patch)
    result = patching.apply_patch(target, body, ctype)
    assert target == NODE
    assert body == patch
    labels = result["metadata"]["labels"]
    new = labels["c"]["deep"] if isinstance(labels["c"], dict) else labels["c"]
    new.append("changed")
    assert body == patch
    result["metadata"]["labels"]["b"] = "changed"  # a merged level is the result's own
    assert target == NODE


def test_json_patch_operations_and_failures() -> None:
    result = patching.apply_patch(
        NODE,
        [
            {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/c"},
            {"op": "move", "from": "/metadata/labels/b", "path": "/metadata/labels/d"},
            {"op": "replace", "path": "/spec/taints/0/key", "value": "k2"},
            {"op": "remove", "path": "/status"},
            {"op": "add", "path": "/metadata/labels/x~1y", "value": "slash"},
        ],
        patching.JSON_PATCH,
    )
    assert result["metadata"]["labels"] == {"a": "1", "c": "1", "d": "2", "x/y": "slash"}
    assert result["spec"]["taints"][0]["key"] == "k2"
    assert "status" not in result
    with pytest.raises(errors.ApiError) as info:
        patching.apply_patch(
            NODE, [{"op": "test", "path": "/metadata/name", "value": "m"}], patching.JSON_PATCH
        )
    assert info.value.code == 422
    with pytest.raises(errors.ApiError) as info:
        patching.apply_patch(NODE, {}, "application/apply-patch+yaml")
    assert info.value.code == 415


def test_unparsable_label_selectors_are_rejected() -> None:
    with pytest.raises(errors.ApiError) as info:
        selectors.parse_label_selector("a in b")
    assert info.value.code == 400
    reqs = selectors.selector_from_label_selector(
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [
                {"key": "b", "operator": "NotIn", "values": ["x"]},
                {"key": "c", "operator": "DoesNotExist"},
            ],
        }
    )
    assert reqs is not None
    assert selectors.matches_labels(reqs, {"a": "1", "b": "y"})
    assert not selectors.matches_labels(reqs, {"a": "1", "c": ""})
    assert selectors.selector_from_label_selector(None) is None
