"""The effects ledger: which applied effects of ended alert runs the reconciler looks at."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from remediator.domain import playbooks, records, runs, transitions
from tests.contract.plans import fire, new_run, run

ACTIONS = ("test.record",)
RETURNING = ("test.return",)
CLOSING = ("effect.orphaned", "effect.vanished")


def ledger(tx: Any, limit: int = 100) -> list[records.LedgerEntry]:
    return tx.effect_ledger(actions=ACTIONS, returning=RETURNING, closed_by=CLOSING, limit=limit)


async def ended_run(
    backend: Any,
    episode: records.Episode,
    *,
    on_resolve: playbooks.ResolvePolicy,
    kind: runs.RunKind = runs.RunKind.ALERT,
    action: str = "test.record",
    end: bool = True,
) -> records.Run:
    """A run of ``episode`` whose one step applied its effect, ended ``succeeded``."""
    new = new_run(episode_id=episode.id, on_resolve=on_resolve, kind=kind, steps=("only",))
    new = dataclasses.replace(new, steps=(dataclasses.replace(new.steps[0], action=action),))

    def work(tx: Any) -> records.Run:
        run_id = tx.insert_run(new, actor="engine")
        current = tx.apply(
            transitions.move_run(tx.get_run(run_id), runs.RunStatus.RUNNING, reason="go")
        )
        [first] = tx.steps_of_run(run_id)
        first = tx.apply(transitions.make_due(first, now=tx.now))
        until = tx.now + dt.timedelta(seconds=30)
        first = tx.apply(transitions.claim(first, owner="w1", lease_until=until, now=tx.now))
        done = transitions.Result(status=runs.StepStatus.SUCCEEDED, output={"set": True})
        tx.apply(transitions.finish(first, done, owner="w1", now=tx.now))
        if not end:
            return current
        return tx.apply(transitions.move_run(current, runs.RunStatus.SUCCEEDED, reason="done"))

    return await run(backend, work)


async def handled(backend: Any, episode: records.Episode) -> records.Episode:
    def work(tx: Any) -> records.Episode:
        current = tx.get_episode(episode.id)
        tx.mark_episode_handled(current)
        return tx.get_episode(episode.id)

    return await run(backend, work)


async def test_kept_effects_of_ended_runs_are_in_the_ledger_until_an_event_closes_them(backend):
    episode = await fire(backend)
    kept = await ended_run(backend, episode, on_resolve=playbooks.ResolvePolicy.CONTINUE)
    [entry] = await run(backend, ledger)
    assert (entry.run.id, entry.step.key, entry.step.effect) == (
        kept.id,
        "only",
        runs.Effect.APPLIED,
    )
    assert (entry.alert_resolved, entry.undo_runs, entry.returned_to_service) == (False, (), False)
    assert await run(backend, lambda tx: ledger(tx, limit=0)) == []

    await run(
        backend,
        lambda tx: tx.add_event("effect.released", actor="reconciler", step_id=entry.step.id),
    )
    assert len(await run(backend, ledger)) == 1  # not a closing kind here
    await run(
        backend,
        lambda tx: tx.add_event("effect.vanished", actor="reconciler", step_id=entry.step.id),
    )
    assert await run(backend, ledger) == []


async def test_undoable_effects_enter_the_ledger_once_their_resolution_was_handled(backend):
    episode = await fire(backend, fingerprint="hot")
    hot = await ended_run(backend, episode, on_resolve=playbooks.ResolvePolicy.UNDO)
    assert await run(backend, ledger) == []  # the alert still fires: the effect is wanted
    resolved = await fire(backend, fingerprint="hot", status="resolved")
    assert await run(backend, ledger) == []  # the engine has not applied on_resolve yet
    await handled(backend, resolved)
    [entry] = await run(backend, ledger)
    assert (entry.run.id, entry.alert_resolved) == (hot.id, True)


async def test_running_runs_other_actions_and_cancel_policies_stay_out(backend):
    episode = await fire(backend, fingerprint="a")
    await ended_run(backend, episode, on_resolve=playbooks.ResolvePolicy.CONTINUE, end=False)
    other = await fire(backend, fingerprint="b", node="gpu-node-04")
    await ended_run(
        backend, other, on_resolve=playbooks.ResolvePolicy.CONTINUE, action="test.other"
    )
    third = await fire(backend, fingerprint="c", node="gpu-node-05")
    await ended_run(backend, third, on_resolve=playbooks.ResolvePolicy.CANCEL)
    await handled(
        backend, await fire(backend, fingerprint="c", node="gpu-node-05", status="resolved")
    )
    assert await run(backend, ledger) == []


async def test_a_later_run_that_returned_the_node_to_service_is_noticed(backend):
    episode = await fire(backend, fingerprint="xid")
    await ended_run(backend, episode, on_resolve=playbooks.ResolvePolicy.CONTINUE)
    [entry] = await run(backend, ledger)
    assert not entry.returned_to_service
    later = await fire(backend, fingerprint="back")
    await ended_run(
        backend, later, on_resolve=playbooks.ResolvePolicy.CONTINUE, action="test.return"
    )
    [entry] = await run(backend, ledger)
    assert entry.returned_to_service
