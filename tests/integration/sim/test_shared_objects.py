"""The simulator's stored objects are shared, never copied, by what only reads them.

A write stores a new object and never changes an old one in place, so a watch event carries
the stored object itself, every watch of the resource sends the same encoded line, and a
PATCH copies the node only where it has to: what the store keeps and what it answers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from remediator.sim import api, testing, values


def _is_node(value: object) -> bool:
    return isinstance(value, dict) and value.get("kind") == "Node"


async def test_a_node_patch_copies_the_node_twice_at_most(
    sim_server: testing.RunningSim, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[str] = []
    clone = values.clone

    def counting(value: Any) -> Any:
        if _is_node(value):
            copies.append(value["metadata"]["name"])
        return clone(value)

    monkeypatch.setattr(values, "clone", counting)
    before = sim_server.store.peek("nodes", "", "gpu-node-01")
    assert before is not None
    await core.patch_node("gpu-node-01", {"metadata": {"labels": {"patched": "yes"}}})
    # the one the store keeps and the one it answers with; none for the watch, the patch,
    # the precondition or the mutation log
    assert copies == ["gpu-node-01"] * 2
    after = sim_server.store.peek("nodes", "", "gpu-node-01")
    assert after is not None
    assert after["metadata"]["labels"]["patched"] == "yes"
    assert "patched" not in before["metadata"]["labels"]  # the old object is as it was
    assert after["status"] == before["status"]


async def test_a_change_carries_the_stored_objects_which_later_writes_leave_alone(
    sim_server: testing.RunningSim, core: client.CoreV1Api
) -> None:
    store = sim_server.store
    await core.patch_node("gpu-node-02", {"spec": {"unschedulable": True}})
    first = store.history[-1]
    assert first.obj is store.peek("nodes", "", "gpu-node-02")
    await core.patch_node("gpu-node-02", {"metadata": {"labels": {"next": "write"}}})
    second = store.history[-1]
    assert second.old is first.obj
    assert first.obj["spec"]["unschedulable"] is True
    assert "next" not in first.obj["metadata"]["labels"]
    assert second.obj["metadata"]["labels"]["next"] == "write"


async def test_watches_of_a_resource_send_one_encoding_of_each_change(
    sim_server: testing.RunningSim, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[object] = []

    class CountingJson:
        """The ``json`` module as the simulator's API sees it, counting watch events made."""

        loads = staticmethod(json.loads)

        @staticmethod
        def dumps(value: Any, **kwargs: Any) -> str:
            if isinstance(value, dict) and "type" in value and "object" in value:
                events.append(value["type"])
            return json.dumps(value, **kwargs)

    rv = (await core.list_node()).metadata.resource_version
    monkeypatch.setattr(api, "json", CountingJson)
    url = f"{sim_server.url}/api/v1/nodes?watch=true&resourceVersion={rv}&timeoutSeconds=2"
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:

        async def first_line() -> bytes:
            async with http.get(url) as resp:
                return await resp.content.readline()

        watches = [asyncio.create_task(first_line()) for _ in range(3)]
        await asyncio.sleep(0.2)  # the three watches are open
        await core.patch_node("gpu-node-03", {"metadata": {"labels": {"seen": "thrice"}}})
        async with asyncio.timeout(5):
            lines = await asyncio.gather(*watches)
    assert lines[0] == lines[1] == lines[2]
    event = json.loads(lines[0])
    assert event["type"] == "MODIFIED"
    assert event["object"]["apiVersion"] == "v1"
    assert event["object"]["metadata"]["labels"]["seen"] == "thrice"
    assert events == ["MODIFIED"]
