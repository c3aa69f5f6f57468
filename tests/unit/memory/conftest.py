"""The real engine on the in-memory store: no database, no HTTP, a fake clock.

``make_engine(*playbooks)`` builds ``worker.Engine`` with the built-in actions, ``test.record``
(which records each application in a file under ``tmp_path``) and ``test.gate`` (which waits
inside ``apply`` until the test opens it).
"""

from __future__ import annotations

import dataclasses
import pathlib
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import yaml

import remediator.app as app_mod
from remediator.adapters.memory import store as memory_store
from remediator.domain import alerts, playbooks, records
from remediator.engine import executor, lifecycle, worker
from remediator.ports import observe
from tests.conftest import FakeClock
from tests.support import gate, recording
from tests.support.alerts import alert_body
from tests.support.notify import FakeNotifier


@dataclasses.dataclass(frozen=True)
class Rules:
    index: playbooks.PlaybookIndex


@dataclasses.dataclass
class Harness:
    engine: worker.Engine
    store: memory_store.MemoryStore
    clock: FakeClock
    notifier: FakeNotifier
    gate: gate.GateAction
    record_path: pathlib.Path

    async def fire(self, *, status: str = "firing", node: str = "gpu-node-03") -> None:
        body = alert_body(status=status, node=node, fingerprint=f"fp-{node}")
        await self.store.receive(alerts.parse_payload(body))

    async def resolve(self, *, node: str = "gpu-node-03") -> None:
        await self.fire(status="resolved", node=node)

    async def settle(self) -> None:
        await self.engine.settle()

    def runs(self) -> list[records.Run]:
        return list(self.store.tables.runs.values())

    def steps(self, run_id: int) -> list[records.Step]:
        return self.store.peek(lambda tx: tx.steps_of_run(run_id))

    def statuses(self, run_id: int) -> list[str]:
        return [step.status.value for step in self.steps(run_id)]

    def applied(self, kind: str = "apply") -> list[str]:
        return [r["label"] for r in recording.read_records(self.record_path) if r["kind"] == kind]

    async def decide(self, step_id: int, *, principal: str, approve: bool = True) -> Any:
        return await self.store.run(
            "approve",
            lambda tx: lifecycle.decide_approval(
                tx, step_id, principal=principal, approve=approve, comment="looked at it"
            ),
        )


def load(*texts: str) -> playbooks.PlaybookIndex:
    return playbooks.PlaybookIndex(
        [playbooks.Playbook.model_validate(yaml.safe_load(textwrap.dedent(t))) for t in texts]
    )


@pytest.fixture
def make_engine(
    tmp_path: pathlib.Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Harness]:
    record_path = tmp_path / "records.jsonl"
    monkeypatch.setenv(recording.ENV, str(record_path))

    def make(*texts: str, **settings: Any) -> Harness:
        registry = app_mod.build_registry(["tests.support.recording"])
        gate_action = gate.GateAction()
        registry.register(gate_action)
        store = memory_store.MemoryStore(clock=clock)
        notifier = FakeNotifier()
        services = executor.Services(
            store=store,
            registry=registry,
            notifier=notifier,
            cluster=None,
            clock=clock,
            observer=observe.NullObserver(),
        )
        values = {"poll_interval": 0.0, "min_pass_interval": 0.0, "lease_seconds": 5.0}
        engine = worker.Engine(
            services, Rules(load(*texts)), worker.EngineSettings(**(values | settings))
        )
        return Harness(engine, store, clock, notifier, gate_action, record_path)

    return make
