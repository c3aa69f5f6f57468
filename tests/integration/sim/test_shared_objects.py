"""The simulator's stored objects are shared, never copied, by what only reads them.

A write stores a new object and never changes an old one in place, so a watch event carries
the stored object itself, every watch of the resource sends the same encoded line, and a
write copies the object once: what the store keeps, which the API answers with.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from remediator.sim import api, testing, values


def _copies(monkeypatch: pytest.MonkeyPatch, kind: str) -> list[str]:
    """The names of the objects of ``kind`` copied from now on (at ``values.clone``)."""
    copies: list[str] = []
    clone = values.clone

    def counting(value: Any) -> Any:
        if isinstance(value, dict) and value.get("kind") == kind:
            copies.append(value["metadata"]["name"])
        return clone(value)

    monkeypatch.setattr(values, "clone", counting)
    return copies


async def test_a_node_patch_copies_the_node_once(
    sim_server: testing.RunningSim, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = _copies(monkeypatch, "Node")
    before = sim_server.store.peek("nodes", "", "gpu-node-01")
    assert before is not None
    await core.patch_node("gpu-node-01", {"metadata": {"labels": {"patched": "yes"}}})
    # the one the store keeps; none for the answer, the watch, the patch, the precondition
    # or the mutation log
    assert copies == ["gpu-node-01"]
    after = sim_server.store.peek("nodes", "", "gpu-node-01")
    assert after is not None
    assert after["metadata"]["labels"]["patched"] == "yes"
    assert "patched" not in before["metadata"]["labels"]  # the old object is as it was
    assert after["status"] == before["status"]


async def test_an_event_created_is_copied_once_and_answered_as_stored(
    sim_server: testing.RunningSim, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = _copies(monkeypatch, "Event")
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="gpu-node-01.once"),
        involved_object=client.V1ObjectReference(kind="Node", name="gpu-node-01"),
        reason="Cordoned",
        message="m",
    )
    answered = await core.create_namespaced_event("default", body)
    assert copies == ["gpu-node-01.once"]  # the one the store keeps
    stored = sim_server.store.peek("events", "default", "gpu-node-01.once")
    assert stored is not None
    assert answered.metadata.resource_version == stored["metadata"]["resourceVersion"]
    assert answered.metadata.uid == stored["metadata"]["uid"]


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
