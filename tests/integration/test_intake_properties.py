"""Property-based intake tests: whatever arrives, never a 500 and never a lost valid alert.

The app runs as a real HTTP server in a background thread; hypothesis drives it synchronously.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remediator.app as app_mod
from remediator.app import settings as settings_mod
from tests.conftest import am_fixture_paths, backends, fresh_pg_database
from tests.integration.conftest import write_playbooks

MAX_BODY = 64 * 1024
PLAYBOOK = """
name: any
match: {alertname: FuzzAlert}
steps:
  - {id: a, action: log, params: {message: "{{ labels.node or \\"none\\" }}"}}
"""


class LiveServer:
    def __init__(self, settings: settings_mod.Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.url = ""

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = app_mod.create_app(self.settings, run_engine=False)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def __enter__(self) -> LiveServer:
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture(scope="module", params=backends())
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("fuzz")
    rules = write_playbooks(tmp / "rules", PLAYBOOK)

    def serve(url: str) -> Iterator[Any]:
        settings = settings_mod.Settings(
            database_url=url, rules=rules, max_body_bytes=MAX_BODY, migrate_on_start=True
        )
        with LiveServer(settings) as server, httpx.Client(base_url=server.url) as client:
            yield client

    if request.param == "sqlite":
        yield from serve(f"sqlite+aiosqlite:///{tmp / 'fuzz.db'}")
    else:
        for url in fresh_pg_database():
            yield from serve(url)


def _post(client: httpx.Client, body: bytes, content_type: str = "application/json") -> Any:
    return client.post("/api/v1/alerts", content=body, headers={"Content-Type": content_type})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)

FIXTURE_BODIES = [json.loads(path.read_bytes()) for path in am_fixture_paths()]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mutated_fixtures(draw: st.DrawFn) -> bytes:
    body = json.loads(json.dumps(draw(st.sampled_from(FIXTURE_BODIES))))
    path = draw(st.sampled_from(_paths(body)[1:]))
    target = body
    for part in path[:-1]:
        target = target[part]
    if draw(st.booleans()):
        target[path[-1]] = draw(json_values)
    else:
        del target[path[-1]]
    return json.dumps(body).encode()


label_names = st.from_regex(r"\A[a-zA-Z_][a-zA-Z0-9_]{0,20}\Z")
values = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=40)


@st.composite
def valid_payloads(draw: st.DrawFn) -> dict[str, Any]:
    labels = draw(st.dictionaries(label_names, values, max_size=6))
    labels["alertname"] = "FuzzAlert"
    # Like Alertmanager's, the fingerprint is a hash of the label set.
    fingerprint = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    fraction = draw(st.sampled_from(["", ".1", ".123", ".123456", ".123456789"]))
    alert = {
        "status": draw(st.sampled_from(["firing", "resolved"])),
        "labels": labels,
        "annotations": draw(st.dictionaries(label_names, values, max_size=3)),
        "startsAt": f"2026-11-30T00:0{draw(st.integers(0, 9))}:00{fraction}Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": draw(values),
        "fingerprint": fingerprint,
    }
    return {
        "version": "4",
        "status": alert["status"],
        "receiver": draw(values),
        "alerts": [alert],
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "",
        "groupKey": draw(values),
        "truncatedAlerts": 0,
        draw(label_names): draw(json_values),
    }


FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(body=st.binary(max_size=2048))
def test_arbitrary_bytes_never_cause_a_server_error(live, body):
    assert _post(live, body).status_code in (200, 400)


@FUZZ
@given(value=json_values)
def test_arbitrary_json_never_causes_a_server_error(live, value):
    response = _post(live, json.dumps(value).encode())
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_payload"


@FUZZ
@given(body=mutated_fixtures())
def test_mutated_real_payloads_are_accepted_or_refused_cleanly(live, body):
    response = _post(live, body)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]["fields"]


@FUZZ
@given(payload=valid_payloads())
def test_every_valid_alert_is_stored(live, payload):
    response = _post(live, json.dumps(payload).encode())
    assert response.status_code == 200, response.text
    alert = payload["alerts"][0]
    stored = live.get("/api/v1/alerts", params={"fingerprint": alert["fingerprint"]}).json()
    assert any(item["labels"] == alert["labels"] for item in stored["items"])


@FUZZ
@given(depth=st.integers(min_value=100, max_value=20_000), kind=st.sampled_from("[{"))
def test_deeply_nested_bodies_are_refused(live, depth, kind):
    body = ('{"a":' * depth + "1" + "}" * depth) if kind == "{" else "[" * depth + "]" * depth
    assert _post(live, body.encode()).status_code in (400, 413)


@FUZZ
@given(size=st.integers(min_value=MAX_BODY + 1, max_value=MAX_BODY * 4))
def test_oversized_bodies_get_413(live, size):
    assert _post(live, b" " * size).status_code == 413


@FUZZ
@given(
    text=st.text(st.characters(max_codepoint=255), max_size=200),
    encoding=st.sampled_from(["utf-16", "latin-1"]),
)
def test_wrong_encodings_are_refused(live, text, encoding):
    body = json.dumps({"receiver": text + "é"}, ensure_ascii=False).encode(encoding)
    assert _post(live, body).status_code == 400


@FUZZ
@given(content_type=st.sampled_from(["text/plain", "application/x-www-form-urlencoded", ""]))
def test_wrong_content_types_get_415(live, content_type):
    body = pathlib.Path(am_fixture_paths()[0]).read_bytes()
    assert _post(live, body, content_type).status_code == 415


@FUZZ
@given(payload=valid_payloads(), where=st.sampled_from(["labels", "annotations", "receiver"]))
def test_nul_characters_are_refused_where_they_would_be_stored(live, payload, where):
    if where == "receiver":
        payload["receiver"] += "\x00"
    else:
        payload["alerts"][0][where]["bad"] = "a\x00b"
    response = _post(live, json.dumps(payload).encode())
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]["fields"][0]["message"]
