"""Fleet guard state, disruptions and the guard snapshot; approvals."""

from __future__ import annotations

import dataclasses
import datetime as dt

from remediator.domain import runs, transitions
from tests.contract.plans import due_step, fire, new_run, run


async def test_guard_state_is_a_keyed_json_document(backend):
    assert await run(backend, lambda tx: tx.get_guard_state("breaker")) == {}
    await run(backend, lambda tx: tx.set_guard_state("breaker", {"open": True, "n": [1, 2]}))
    await run(backend, lambda tx: tx.set_guard_state("silence:run:1", {"id": "a"}))
    await run(backend, lambda tx: tx.set_guard_state("silence:run:2", {"id": "b"}))
    await run(backend, lambda tx: tx.set_guard_state("breaker", {"open": False}))
    assert await run(backend, lambda tx: tx.get_guard_state("breaker")) == {"open": False}
    assert await run(backend, lambda tx: tx.guard_states("silence:run:")) == {
        "silence:run:1": {"id": "a"},
        "silence:run:2": {"id": "b"},
    }
    await run(backend, lambda tx: tx.delete_guard_state("silence:run:1"))
    await run(backend, lambda tx: tx.delete_guard_state("absent"))
    assert list(await run(backend, lambda tx: tx.guard_states("silence:"))) == ["silence:run:2"]


async def test_a_value_read_out_is_a_copy(backend):
    def change_what_was_read(tx):
        tx.set_guard_state("k", {"items": [1]})
        tx.get_guard_state("k")["items"].append(2)
        return tx.get_guard_state("k")

    assert await run(backend, change_what_was_read) == {"items": [1]}


async def _runs(backend, *playbooks_and_flags):
    episode = await fire(backend)
    ids = []
    for playbook, kind, dry_run in playbooks_and_flags:
        new = new_run(episode_id=episode.id, playbook=playbook, kind=kind, dry_run=dry_run)
        ids.append(await run(backend, lambda tx, new=new: tx.insert_run(new, actor="engine")))
    return ids


async def test_disruptions_are_recorded_once_per_run_and_node_and_released(backend):
    first, second = await _runs(
        backend,
        ("reboot", runs.RunKind.ALERT, False),
        ("drain", runs.RunKind.ALERT, False),
    )

    def snapshot(node=None, pool=None):
        def read(tx):
            found = tx.guard_snapshot(
                node=node, since=tx.now, disruptive_playbooks=[], gpu_nodes=4, pool=pool
            )
            # the disrupted nodes are read inside the transaction
            return dataclasses.replace(found, disrupted_nodes=set(found.disrupted_nodes))

        return run(backend, read)

    start = backend.clock.now
    await run(backend, lambda tx: tx.record_disruption(run_id=first, node="a", pool="x"))
    backend.clock.advance(10)
    await run(backend, lambda tx: tx.record_disruption(run_id=first, node="a", pool="x"))
    await run(backend, lambda tx: tx.record_disruption(run_id=second, node="b", pool="y"))
    taken = await snapshot(node="a")
    assert taken.disrupted_nodes == {"a", "b"}
    assert taken.node_last_disrupted == start  # the second record changed nothing
    assert taken.gpu_nodes == 4
    assert (await snapshot(pool="x")).disrupted_nodes == {"a"}
    assert (await snapshot(node="c")).node_last_disrupted is None
    backend.clock.advance(10)
    assert await run(backend, lambda tx: tx.release_disruptions(run_id=first)) == 1
    assert await run(backend, lambda tx: tx.release_disruptions(run_id=first)) == 0
    released = await snapshot(node="a")
    assert released.disrupted_nodes == {"b"}
    assert released.node_last_disrupted == backend.clock.now  # released, not started
    assert await run(backend, lambda tx: tx.release_disruptions(node="b")) == 1
    assert (await snapshot()).disrupted_nodes == frozenset()


async def test_recent_runs_count_live_alert_runs_of_disruptive_playbooks_since_a_reset(
    backend,
):
    start = backend.clock.now
    await _runs(
        backend,
        ("reboot", runs.RunKind.ALERT, False),
        ("reboot", runs.RunKind.UNDO, False),
        ("drain", runs.RunKind.ALERT, True),
        ("notify", runs.RunKind.ALERT, False),
    )

    def snapshot(tx, since=start):
        return tx.guard_snapshot(
            node=None, since=since, disruptive_playbooks=["reboot", "drain"], gpu_nodes=None
        )

    first = await run(backend, snapshot)
    assert (first.recent_runs, first.breaker_open) == (1, False)
    later = start + dt.timedelta(seconds=1)
    assert (await run(backend, lambda tx: snapshot(tx, since=later))).recent_runs == 0
    reset = {"open": True, "reset_at": start.isoformat()}
    await run(backend, lambda tx: tx.set_guard_state("breaker", reset))
    after_reset = await run(backend, snapshot)
    assert (after_reset.recent_runs, after_reset.breaker_open) == (0, True)


async def test_a_principal_decides_a_step_once_and_decisions_read_in_order(backend):
    step = await due_step(backend)

    def decide(principal, decision="approved"):
        return run(
            backend,
            lambda tx: tx.add_approval(
                step.id, principal=principal, decision=decision, comment=f"by {principal}"
            ),
        )

    assert await decide("alice") is True
    assert await decide("alice", "rejected") is False
    backend.clock.advance(5)
    assert await decide("bob", "rejected") is True
    rows = await run(backend, lambda tx: tx.approvals_of(step.id))
    assert [(r["step_id"], r["principal"], r["decision"], r["comment"]) for r in rows] == [
        (step.id, "alice", "approved", "by alice"),
        (step.id, "bob", "rejected", "by bob"),
    ]
    assert rows[1]["at"] == backend.clock.now
    assert set(rows[0]) == {"id", "step_id", "principal", "decision", "comment", "at"}


async def test_steps_waiting_since_a_cutoff_are_those_whose_run_parked_by_then(backend):
    step = await due_step(backend)

    def park(tx):
        parked = tx.apply(transitions.park(tx.get_step(step.id)))
        current = tx.get_run(step.run_id)
        tx.apply(transitions.move_run(current, runs.RunStatus.WAITING_APPROVAL, reason="park"))
        return parked

    parked_at = backend.clock.now
    await run(backend, park)

    def waiting(cutoff):
        return run(backend, lambda tx: [s.id for s in tx.steps_waiting_since(cutoff, 10)])

    assert await waiting(parked_at - dt.timedelta(seconds=1)) == []
    assert await waiting(parked_at) == [step.id]


async def test_a_transaction_sees_its_own_guard_writes_in_later_snapshots(backend):
    """Guard decisions in one transaction (a claim pass admitting a burst) each see the ones
    before them: disruptions recorded, rolled back with their savepoint, released; the breaker
    set; a run created that counts as recent."""
    first, second = await _runs(
        backend, ("reboot", runs.RunKind.ALERT, False), ("drain", runs.RunKind.ALERT, False)
    )

    def decisions(tx):
        def snapshot(pool=None):
            found = tx.guard_snapshot(
                node=None, since=tx.now, disruptive_playbooks=["reboot"], gpu_nodes=8, pool=pool
            )
            # a snapshot's disrupted nodes are read in the decision it is for: copied here
            return dataclasses.replace(found, disrupted_nodes=set(found.disrupted_nodes))

        seen = [snapshot().disrupted_nodes, snapshot(pool="x").disrupted_nodes]
        tx.record_disruption(run_id=first, node="a", pool="x")
        tx.record_disruption(run_id=second, node="b", pool="y")
        seen += [snapshot().disrupted_nodes, snapshot(pool="x").disrupted_nodes]
        try:
            with tx.savepoint():
                tx.record_disruption(run_id=second, node="c", pool="x")
                seen.append(snapshot(pool="x").disrupted_nodes)
                raise RuntimeError("the unit failed")
        except RuntimeError:
            pass
        seen.append(snapshot(pool="x").disrupted_nodes)
        tx.release_disruptions(run_id=first)
        seen.append(snapshot().disrupted_nodes)
        recent = snapshot().recent_runs
        tx.insert_run(new_run(episode_id=None, playbook="reboot"), actor="engine")
        tx.set_guard_state("breaker", {"open": True})
        after = snapshot()
        return seen, (recent, after.recent_runs, after.breaker_open)

    seen, (recent, later, breaker_open) = await run(backend, decisions)
    assert seen == [set(), set(), {"a", "b"}, {"a"}, {"a", "c"}, {"a"}, {"b"}]
    assert (later - recent, breaker_open) == (1, True)
