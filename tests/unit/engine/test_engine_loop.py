"""``Engine.run_forever``: a pass that raises never ends the loop, and every pass is reported."""

from __future__ import annotations

import asyncio
import datetime as dt
import types
from typing import Any

import pytest

from remediator.adapters import metrics
from remediator.domain import errors, playbooks, records
from remediator.engine import executor, worker
from remediator.ports import actions, observe
from remediator.ports import cluster as cluster_port

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
IDLE = records.Probe(episodes=False, expired=False, startable=False, advance=False, due=False)


class FlakyStore:
    """A store whose probe raises the given errors in turn, then finds no work."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.hint_sweeps = 0
        self.wake_sweeps: list[int] = []
        self.held_rechecks: list[str] = []
        self.transactions: list[str] = []

    async def probe(self) -> records.Probe:
        if self.failures:
            raise self.failures.pop(0)
        return IDLE

    async def hint_runs_to_advance(self) -> int:
        self.hint_sweeps += 1
        return 0

    async def wake_parked_runs(self, slots: Any) -> int:
        self.wake_sweeps.append(slots("gone"))  # a playbook no longer loaded: one at a time
        return 0

    async def wake_first_held(self, prefix: str) -> int:
        self.held_rechecks.append(prefix)
        return 0

    async def run(self, name: str, work: Any) -> Any:
        self.transactions.append(name)


class Passes(observe.NullObserver):
    def __init__(self) -> None:
        self.ended: list[tuple[dt.datetime, Exception | None]] = []

    def pass_finished(self, *, at: dt.datetime, error: Exception | None = None) -> None:
        self.ended.append((at, error))


def _engine(store: FlakyStore, observer: observe.Observer) -> worker.Engine:
    services = executor.Services(
        store=store,  # type: ignore[arg-type]
        registry=actions.Registry(),
        notifier=None,  # type: ignore[arg-type]
        cluster=None,
        clock=lambda: NOW,
        observer=observer,
    )
    rules = types.SimpleNamespace(index=playbooks.PlaybookIndex([]))
    return worker.Engine(
        services, rules, worker.EngineSettings(poll_interval=0, min_pass_interval=0)
    )


async def _run_until(engine: worker.Engine, done: object) -> None:
    task = asyncio.create_task(engine.run_forever())
    async with asyncio.timeout(5):
        while not done():  # type: ignore[operator]
            assert not task.done(), task
            await asyncio.sleep(0)
    await engine.stop()
    await task


async def test_passes_that_raise_anything_are_reported_and_the_loop_goes_on():
    failures = [KeyError("bug"), errors.StoreUnavailable("down"), ValueError("too long")]
    observer = Passes()
    engine = _engine(FlakyStore(*failures), observer)
    await _run_until(engine, lambda: len(observer.ended) >= 5)
    assert [error for _, error in observer.ended[:5]] == [*failures, None, None]
    assert {at for at, _ in observer.ended} == {NOW}


async def test_the_leader_looks_for_unhinted_and_parked_runs_at_the_first_pass_then_each_interval():
    store, observer = FlakyStore(), Passes()
    engine = _engine(store, observer)
    await _run_until(engine, lambda: len(observer.ended) >= 5)
    assert store.hint_sweeps == 1  # the interval (a minute) has not passed since
    assert store.wake_sweeps == [1]  # and the parked runs looked at with it


async def test_the_leader_looks_for_parked_runs_again_once_the_rules_are_reloaded():
    """A reload may raise a playbook's concurrency: the runs waiting for its slots are
    looked at then, not up to a minute later; and its budget: every held step is looked at
    again (once)."""
    store, observer = FlakyStore(), Passes()
    engine = _engine(store, observer)
    swept_before: list[int] = []

    def reload_after_three_passes() -> bool:
        if len(observer.ended) >= 3 and not swept_before:
            swept_before.append(len(store.wake_sweeps))
            engine.rules.index = playbooks.PlaybookIndex([])  # type: ignore[misc]
        return len(observer.ended) >= 6

    await _run_until(engine, reload_after_three_passes)
    assert swept_before == [1]
    assert store.wake_sweeps == [1, 1]
    assert store.transactions == ["wake held steps"]
    assert store.held_rechecks == ["budget:"]  # the first in line, at the first pass


async def test_the_leader_looks_at_the_first_held_step_in_line_every_recheck(clock):
    store, observer = FlakyStore(), Passes()
    engine = _engine(store, observer)
    engine.services.clock = clock  # type: ignore[misc]
    for _ in range(3):
        await engine.tick()
    assert store.held_rechecks == ["budget:"]
    clock.advance(engine.settings.guards.recheck.total_seconds())
    await engine.tick()
    assert store.held_rechecks == ["budget:"] * 2
    engine.is_leader = lambda: False
    clock.advance(engine.settings.guards.recheck.total_seconds())
    await engine.tick()
    assert store.held_rechecks == ["budget:"] * 2


async def test_a_replica_that_does_not_lead_never_looks_for_unhinted_runs():
    store, observer = FlakyStore(), Passes()
    engine = _engine(store, observer)
    engine.is_leader = lambda: False
    await _run_until(engine, lambda: len(observer.ended) >= 5)
    assert store.hint_sweeps == 0
    assert store.wake_sweeps == []


async def test_the_loop_still_ends_when_cancelled():
    engine = _engine(FlakyStore(*[RuntimeError("again")] * 1000), Passes())
    task = asyncio.create_task(engine.run_forever())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class RecordedMetrics(metrics.Metrics):
    """The real metrics, and what readiness would have read after each pass."""

    def __init__(self) -> None:
        super().__init__()
        self.states: list[metrics.FailingPasses] = []

    def pass_finished(self, *, at: dt.datetime, error: Exception | None = None) -> None:
        super().pass_finished(at=at, error=error)
        self.states.append(self.failing)


async def test_metrics_count_failing_passes_in_a_row_until_one_completes():
    observer = RecordedMetrics()
    failures = [KeyError("bug"), errors.StoreUnavailable("down"), KeyError("bug")]
    engine = _engine(FlakyStore(*failures), observer)
    await _run_until(engine, lambda: len(observer.states) >= 4)
    assert observer.states[:4] == [
        metrics.FailingPasses(count=1, since=NOW, last_error="KeyError"),
        metrics.FailingPasses(count=2, since=NOW, last_error="StoreUnavailable"),
        metrics.FailingPasses(count=3, since=NOW, last_error="KeyError"),
        metrics.FailingPasses(),
    ]
    sample = observer.registry.get_sample_value
    assert sample("remediator_engine_pass_failures_total", {"reason": "error"}) == 2
    assert sample("remediator_engine_pass_failures_total", {"reason": "store_unavailable"}) == 1
    assert sample("remediator_engine_consecutive_pass_failures") == 0
    assert sample("remediator_engine_last_success_timestamp_seconds") == NOW.timestamp()


class WatchedFleet:
    """A cluster whose GPU nodes are kept by a watch: ``gpu_fleet`` answers only when the
    test lets it (the first list), then the test changes the fleet as a watch would."""

    gpu_node_selector = ""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.fleet = cluster_port.GpuFleet({"gpu-1": {}})
        self.calls = 0

    async def gpu_fleet(self) -> cluster_port.GpuFleet:
        self.calls += 1
        await self.answer.wait()
        return self.fleet

    async def list_nodes(self, selector: str = "") -> list[Any]:
        raise AssertionError("the engine lists no nodes: the watch keeps them")


async def test_passes_read_the_watched_fleet_and_never_list_it():
    """The first pass waits for the GPU nodes to be listed; from then on every pass reads
    the fleet the cluster's watch keeps (a label change is seen by the next pass), and the
    fleet is never listed again (listing 5,800 nodes every 15 s held a pass 150 ms)."""
    cluster = WatchedFleet()
    engine = _engine(FlakyStore(), observe.NullObserver())
    engine.services.cluster = cluster  # type: ignore[assignment]
    first = asyncio.create_task(engine._fleet())
    await asyncio.sleep(0.01)
    assert not first.done()  # nothing listed yet: it waits
    cluster.answer.set()
    assert dict(await first) == {"gpu-1": {}}

    cluster.fleet.put("gpu-2", {"pool": "a"})
    cluster.fleet.put("gpu-1", {"pool": "b"})
    seen = await engine._fleet()
    assert dict(seen) == {"gpu-1": {"pool": "b"}, "gpu-2": {"pool": "a"}}
    assert seen.pool_sizes("pool") == {"a": 1, "b": 1}
    assert await engine._fleet() is seen  # nothing changed: the same snapshot
    cluster.fleet.remove("gpu-2")
    assert list(await engine._fleet()) == ["gpu-1"]
    assert dict(seen) == {"gpu-1": {"pool": "b"}, "gpu-2": {"pool": "a"}}  # never changed
    assert cluster.calls == 1


async def test_the_gpu_nodes_are_listed_before_the_first_alert():
    """An idle engine asks for the GPU nodes when it starts, so the first alert's pass does
    not wait for a large fleet's list."""
    cluster = WatchedFleet()
    cluster.answer.set()
    engine = _engine(FlakyStore(), observe.NullObserver())
    engine.services.cluster = cluster  # type: ignore[assignment]
    await _run_until(engine, lambda: engine._gpu_fleet is not None)
    assert cluster.calls == 1
