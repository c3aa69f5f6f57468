"""``Engine.run_forever``: a pass that raises never ends the loop, and every pass is reported."""

from __future__ import annotations

import asyncio
import datetime as dt
import types

import pytest

from remediator.adapters import metrics
from remediator.domain import errors, playbooks, records
from remediator.engine import executor, worker
from remediator.ports import actions, observe

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
IDLE = records.Probe(episodes=False, expired=False, startable=False, advance=False, due=False)


class FlakyStore:
    """A store whose probe raises the given errors in turn, then finds no work."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)

    async def probe(self) -> records.Probe:
        if self.failures:
            raise self.failures.pop(0)
        return IDLE


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


class SlowFleet:
    """A cluster whose node list answers only when the test lets it."""

    gpu_node_selector = ""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.lists = 0

    async def list_nodes(self, selector: str = "") -> list[types.SimpleNamespace]:
        self.lists += 1
        await self.answer.wait()
        self.answer.clear()
        return [types.SimpleNamespace(name=f"gpu-{self.lists}", labels={})]


async def test_passes_wait_for_the_gpu_node_list_only_when_it_is_missing_or_too_old():
    """Listing every GPU node is renewed in the background from two thirds of its refresh
    age: a pass in between goes on with the list it has (5,000 nodes held a pass a quarter of
    a second); a pass waits only for the first list or one older than the refresh age."""
    now = [NOW]
    cluster = SlowFleet()
    engine = _engine(FlakyStore(), observe.NullObserver())
    engine.services.cluster = cluster  # type: ignore[assignment]
    engine.services.clock = lambda: now[0]
    first = asyncio.create_task(engine._fleet())
    await asyncio.sleep(0.01)
    assert not first.done()  # nothing listed yet: it waits
    cluster.answer.set()
    assert list(await first) == ["gpu-1"]

    now[0] += dt.timedelta(seconds=11)  # past two thirds of the 15 s: renewed, not waited for
    assert list(await asyncio.wait_for(engine._fleet(), 1)) == ["gpu-1"]
    assert cluster.lists == 2
    assert list(await asyncio.wait_for(engine._fleet(), 1)) == ["gpu-1"]
    assert cluster.lists == 2  # one renewal at a time
    cluster.answer.set()
    await asyncio.sleep(0.01)
    assert list(await asyncio.wait_for(engine._fleet(), 1)) == ["gpu-2"]

    now[0] += dt.timedelta(seconds=16)  # too old: this pass waits for the new list
    late = asyncio.create_task(engine._fleet())
    await asyncio.sleep(0.01)
    assert not late.done()
    cluster.answer.set()
    assert list(await late) == ["gpu-3"]


async def test_the_gpu_node_list_is_read_before_the_first_alert():
    """An idle engine lists the GPU nodes when it starts, so the first alert's pass does not
    wait for a large fleet's list."""
    cluster = SlowFleet()
    cluster.answer.set()
    engine = _engine(FlakyStore(), observe.NullObserver())
    engine.services.cluster = cluster  # type: ignore[assignment]
    await _run_until(engine, lambda: engine._gpu_nodes is not None)
    assert cluster.lists == 1
