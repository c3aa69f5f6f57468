"""Fuzzing the front door over real HTTP: whatever arrives, never a 5xx, never a slow answer,
and ``/healthz`` keeps answering within a second, gzip bombs included.

On each backend a real server (its own process, a listening socket; the engine not running) gets
``REQUESTS`` requests from one seeded generator (``tests/support/fuzz.py``), ``CONCURRENCY``
at a time from many loopback addresses, while a poller asks ``/healthz`` every 100 ms. Then
gzip bombs (1 GiB of zeros, about 1 MiB on the wire) go to every form and JSON endpoint at
once. The seed is printed and named in every failure: ``REMEDIATOR_FUZZ_SEED=<seed>`` replays
the same requests. Each phase has a wall-time budget and fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import heapq
import json
import os
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, am_fixture_paths, backends, fresh_pg_database
from tests.integration.operators.conftest import TOKENS, write_tokens
from tests.support import fuzz, live, rawhttp

REQUESTS = int(os.environ.get("REMEDIATOR_FUZZ_REQUESTS", "5000"))  # a new seed every run
SEED = int(os.environ.get("REMEDIATOR_FUZZ_SEED", str(random.SystemRandom().randrange(2**32))))
CONCURRENCY = 16
BUDGET = 150.0  # seconds for all requests of one backend
SLOW = 2.0  # no answer may take this much longer than it must (see ``_late``)
BODY_READ_TIMEOUT = 1.0  # a body still arriving then is answered 408, not before
HEALTH_WITHIN = 1.0
POLL_EVERY = 0.1
MAX_BODY = 256 * 1024
BOMB_SIZE = 1 << 30
BOMBING = 5.0  # seconds of bombs in flight, again and again
STALL_PROBE = 0.05
CLIENT_STALL = 0.5  # this process woke this much late: it was not running
SET_ASIDE_AT_MOST = 0.25  # of all requests and polls, or the run cannot judge the server
ROLES = {"operator": "olivia", "auditor": "ada", "admin": "root"}

pytestmark = pytest.mark.serial  # it judges answer times: the machine to itself


@dataclasses.dataclass
class Target:
    port: int
    creds: fuzz.Credentials


def _session(client: httpx.Client, name: str) -> fuzz.Session:
    client.cookies.clear()
    page = client.get("/runbooks/login").text
    nonce = re.search(r'name="csrf" value="([^"]+)"', page)
    assert nonce is not None
    signed = client.post("/runbooks/login", data={"token": TOKENS[name][0], "csrf": nonce[1]})
    assert signed.status_code == 303, signed.text
    cookie = signed.cookies["remediator_session"]
    client.cookies.clear()
    page = client.get("/runbooks", headers={"Cookie": f"remediator_session={cookie}"}).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None
    return fuzz.Session(cookie, csrf[1])


def _seed_data(client: httpx.Client) -> None:
    """Episodes, deliveries and runs for the odd ids' small numbers to find."""
    ingest = {"Authorization": f"Bearer {TOKENS['alertmanager'][0]}"}
    for path in am_fixture_paths():
        answer = client.post(
            "/api/v1/alerts",
            content=path.read_bytes(),
            headers={**ingest, "Content-Type": "application/json"},
        )
        assert answer.status_code == 200, answer.text
    operator = {"Authorization": f"Bearer {TOKENS['olivia'][0]}"}
    for book, body in [
        ("return-node-to-service", {"node": "gpu-node-03"}),
        ("fleet-health-sweep", {"dryRun": True}),
    ]:
        answer = client.post(f"/api/v1/runbooks/{book}/runs", json=body, headers=operator)
        assert answer.status_code == 201, answer.text


def _credentials(client: httpx.Client) -> fuzz.Credentials:
    nonces = []
    for _ in range(20):
        client.cookies.clear()
        nonces.append(client.get("/runbooks/login").cookies["remediator_login"])
    return fuzz.Credentials(
        tokens=dict(TOKENS),
        sessions={role: _session(client, name) for role, name in ROLES.items()},
        spare={role: _session(client, name) for role, name in ROLES.items()},
        nonces=nonces,
        runbooks=["return-node-to-service", "fleet-health-sweep"],
        bodies=[json.loads(path.read_bytes()) for path in am_fixture_paths()],
        max_body=MAX_BODY,
    )


@pytest.fixture(scope="module", params=backends())
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("fuzz-http")
    (tmp / "artifacts").mkdir()
    (tmp / "artifacts" / "a").write_text("artifact")

    def serve(url: str) -> Iterator[Target]:
        settings = {
            "database_url": url,
            "rules": str(ROOT / "rules"),
            "tokens": str(write_tokens(tmp)),
            "max_body_bytes": MAX_BODY,
            "body_read_timeout": BODY_READ_TIMEOUT,
            "artifact_dir": str(tmp / "artifacts"),
            "migrate_on_start": True,
            "log_level": "WARNING",
        }
        with live.LiveProcess(settings, log=tmp / "server.log") as server:
            with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as client:
                _seed_data(client)
                creds = _credentials(client)
            yield Target(server.port, creds)
            assert server.process.poll() is None, server.log_tail()

    if request.param == "sqlite":
        yield from serve(f"sqlite+aiosqlite:///{tmp / 'fuzz.db'}")
    else:
        for url in fresh_pg_database():
            yield from serve(url)


@dataclasses.dataclass
class Stalls:
    """When this test process itself stood still: a probe sleeping ``STALL_PROBE`` woke more than
    ``CLIENT_STALL`` late (the machine was busy elsewhere, or paused). An answer that was slow
    while its own client could not run says nothing about the server, so it is set aside; a 5xx
    or a broken answer never is, and too many set aside fails the test as unjudgeable."""

    intervals: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(STALL_PROBE)
            after = time.monotonic()
            if after - before - STALL_PROBE > CLIENT_STALL:
                self.intervals.append((before, after))

    def during(self, answer: rawhttp.Answer) -> bool:
        end = time.monotonic()
        start = end - answer.elapsed
        return any(first < end and start < last for first, last in self.intervals)


def _slow_only(answer: rawhttp.Answer) -> bool:
    """Slow, or no answer in time, and nothing worse."""
    timed_out = answer.status == 0 and answer.error.startswith("no answer within")
    return timed_out or (answer.status < 500 and _late(answer) >= SLOW)


def _late(answer: rawhttp.Answer) -> float:
    """How much longer than it must an answer took: a 408 cannot come before the body's read
    deadline (the slowest answers of every run, at about 1.04 s), any other answer at once."""
    return answer.elapsed - (BODY_READ_TIMEOUT if answer.status == 408 else 0.0)


@dataclasses.dataclass
class Report:
    seed: int
    statuses: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    failures: list[str] = dataclasses.field(default_factory=list)
    slowest: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    health: list[float] = dataclasses.field(default_factory=list)
    health_failures: list[str] = dataclasses.field(default_factory=list)
    stalls: Stalls = dataclasses.field(default_factory=Stalls)
    set_aside: list[str] = dataclasses.field(default_factory=list)

    def record(self, index: int, wire: rawhttp.Wire, answer: rawhttp.Answer) -> None:
        self.statuses[answer.status] += 1
        entry = (answer.elapsed, f"{answer.status} {wire.method!r} {wire.target[:80]!r}")
        heapq.heappush(self.slowest, entry)
        if len(self.slowest) > 5:
            heapq.heappop(self.slowest)
        if answer.status >= 500 or answer.status == 0 or _late(answer) >= SLOW:
            what = (
                f"#{index} {answer.status} in {answer.elapsed:.2f} s {answer.error} "
                f"{answer.body[:200]!r} <- {wire.describe()}"
            )
            if _slow_only(answer) and self.stalls.during(answer):
                self.set_aside.append(what)
            else:
                self.failures.append(what)

    def summary(self) -> str:
        health = max(self.health, default=0.0)
        statuses = dict(sorted(self.statuses.items()))
        stalls = ", ".join(f"{last - first:.2f} s" for first, last in self.stalls.intervals)
        return (
            f"seed {self.seed} (REMEDIATOR_FUZZ_SEED={self.seed} replays it): "
            f"{sum(self.statuses.values())} requests, statuses {statuses}; "
            f"client stalls [{stalls}], {len(self.set_aside)} slow answers set aside; "
            f"{len(self.health)} /healthz polls, slowest {health:.3f} s; slowest requests: "
            + ", ".join(f"{t:.3f} s {what}" for t, what in sorted(self.slowest, reverse=True))
        )


async def _poll_health(port: int, report: Report, stop: asyncio.Event) -> None:
    wire = rawhttp.Wire(b"GET", b"/healthz")
    while not stop.is_set():
        answer = await rawhttp.send(wire, port=port, timeout=HEALTH_WITHIN * 3)
        report.health.append(answer.elapsed)
        if answer.status != 200 or answer.elapsed >= HEALTH_WITHIN:
            what = f"/healthz {answer.status} in {answer.elapsed:.2f} s {answer.error}"
            slow = answer.status in (0, 200) and report.stalls.during(answer)
            (report.set_aside if slow else report.health_failures).append(what)
        await asyncio.sleep(POLL_EVERY)


async def _while_polling(port: int, report: Report, work: Any, budget: float) -> None:
    stop = asyncio.Event()
    watcher = asyncio.create_task(report.stalls.watch(stop))
    poller = asyncio.create_task(_poll_health(port, report, stop))
    try:
        async with asyncio.timeout(budget):
            await work
    except TimeoutError:
        pytest.fail(f"not done within {budget:g} s; {report.summary()}")
    finally:
        stop.set()
        await poller
        await watcher


def _assert_clean(report: Report) -> None:
    print(report.summary())
    problems = report.failures[:20] + report.health_failures[:20]
    assert not problems, report.summary() + "\n" + "\n".join(problems)
    judged = sum(report.statuses.values()) + len(report.health)
    assert len(report.set_aside) <= judged * SET_ASIDE_AT_MOST, (
        f"the client stood still too often to judge the server: {report.stalls.intervals}\n"
        + "\n".join(report.set_aside[:20])
    )


@pytest.mark.timeout(BUDGET + 30)
async def test_thousands_of_hostile_requests_get_no_5xx_and_no_slow_answer(target):
    report = Report(SEED)
    print(f"fuzz seed {SEED}")
    requests = iter(enumerate(fuzz.Generator(SEED, target.creds)))

    async def worker() -> None:
        for index, (wire, source) in requests:
            if index >= REQUESTS:
                return
            answer = await rawhttp.send(
                wire, port=target.port, local=source, timeout=BODY_READ_TIMEOUT + SLOW * 2
            )
            report.record(index, wire, answer)

    started = time.monotonic()
    work = asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    await _while_polling(target.port, report, work, BUDGET)
    print(f"{REQUESTS} requests in {time.monotonic() - started:.1f} s")
    assert sum(report.statuses.values()) >= REQUESTS
    _assert_clean(report)


def _bombs(creds: fuzz.Credentials) -> list[rawhttp.Wire]:
    """A gzip and a deflate bomb to every form and JSON endpoint, with valid credentials (an
    admin's session cookie for forms, an admin token for JSON) and without."""
    bombs = {
        b"gzip": fuzz.gzip_bomb(BOMB_SIZE),
        b"deflate": fuzz.gzip_bomb(BOMB_SIZE, container="deflate"),
    }
    session = creds.sessions["admin"]
    nonce = creds.nonces[-1]
    forms = {
        "/runbooks/login": f"remediator_login={nonce}",
        "/runbooks/logout": f"remediator_session={creds.spare['admin'].cookie}",
        "/runbooks/return-node-to-service/trigger": f"remediator_session={session.cookie}",
        "/runbooks/runs/1/steps/1/approve": f"remediator_session={session.cookie}",
        "/runbooks/runs/1/steps/1/reject": f"remediator_session={session.cookie}",
    }
    admin = b"Bearer " + creds.tokens["root"][0].encode()
    endpoints = [
        (path, fuzz.FORM_TYPE, b"Cookie", cookie.encode()) for path, cookie in forms.items()
    ]
    endpoints += [
        (path, fuzz.JSON_TYPE, b"Authorization", admin)
        for path in (
            "/api/v1/alerts",
            "/api/v1/plan",
            "/api/v1/runbooks/return-node-to-service/runs",
            "/api/v1/runs/1/steps/1/approve",
            "/api/v1/runs/1/steps/1/reject",
            "/api/v1/breaker/reset",
        )
    ]
    wires = []
    for path, content_type, name, value in endpoints:
        for encoding, bomb in bombs.items():
            for credentials in ([(name, value)], []):
                headers = (
                    (b"Content-Type", content_type),
                    (b"Content-Encoding", encoding),
                    *credentials,
                )
                wires.append(rawhttp.Wire(b"POST", path.encode(), headers, bomb))
    return wires


@pytest.mark.timeout(90)
async def test_gzip_bombs_to_every_endpoint_are_refused_fast_while_healthz_answers(target):
    wires = _bombs(target.creds)
    report = Report(SEED)
    answers: list[tuple[rawhttp.Wire, rawhttp.Answer, bool]] = []

    async def post(wire: rawhttp.Wire, source: str) -> None:
        answer = await rawhttp.send(wire, port=target.port, local=source)
        answers.append((wire, answer, report.stalls.during(answer)))

    async def rounds() -> None:
        started = time.monotonic()
        while time.monotonic() - started < BOMBING:
            await asyncio.gather(*(post(wire, f"127.0.2.{n}") for n, wire in enumerate(wires)))

    await _while_polling(target.port, report, rounds(), 60.0)
    wrong = []
    for wire, answer, stalled in answers:
        if 400 <= answer.status < 500 and answer.elapsed < SLOW:
            continue
        what = f"{answer.status} in {answer.elapsed:.2f} s {answer.error} <- {wire.describe(0)}"
        (report.set_aside if stalled and _slow_only(answer) else wrong).append(what)
    report.statuses.update(answer.status for _, answer, _ in answers)
    slowest = max(answer.elapsed for _, answer, _ in answers)
    print(f"{len(answers)} bombs to {len(wires)} endpoint variants, slowest {slowest:.3f} s")
    assert wrong[:20] == [], report.summary()
    assert len(report.health) >= BOMBING  # one poll after another, each within a second
    _assert_clean(report)
