"""``GpuFleet`` and its snapshots: what the guards count, kept as a full copy of the fleet
with the changes since beside it and the pool sizes counted change by change, so a snapshot
after a label change never walks the fleet."""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator, Mapping

import pytest

from remediator.ports import cluster as port


class Counted(Mapping[str, str]):
    """Node labels that count the lookups made in them (a full pool count is one per node)."""

    lookups = 0

    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels

    def __getitem__(self, key: str) -> str:
        Counted.lookups += 1
        return self._labels[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._labels.items())))


def check(snapshot: port.FleetSnapshot, model: dict[str, dict[str, str]]) -> None:
    assert dict(snapshot) == model
    assert len(snapshot) == len(model)
    assert sorted(snapshot) == sorted(model)
    for name in ("n0", "n7", "n42", "nobody"):
        assert (name in snapshot) == (name in model)
        assert snapshot.get(name) == model.get(name)
    expected = collections.Counter(labels.get("pool") for labels in model.values())
    assert snapshot.pool_sizes("pool") == expected


@pytest.mark.parametrize("seed", range(5))
def test_snapshots_show_the_fleet_as_it_was_whatever_changed_after(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(port.GpuFleet, "MAX_CHANGES", 16, raising=False)  # copies made often
    rnd = random.Random(seed)

    def labels() -> dict[str, str]:
        return {"pool": rnd.choice("abc")} if rnd.random() < 0.8 else {}

    model = {f"n{i}": labels() for i in range(60)}
    fleet = port.GpuFleet(model)
    taken: list[tuple[port.FleetSnapshot, dict[str, dict[str, str]]]] = []
    for _ in range(400):
        roll = rnd.random()
        name = f"n{rnd.randrange(80)}"
        if roll < 0.6:
            model[name] = labels()
            fleet.put(name, dict(model[name]))
        elif roll < 0.95:
            model.pop(name, None)
            fleet.remove(name)
        else:
            model = {f"n{i}": labels() for i in rnd.sample(range(80), 50)}
            fleet.replace({k: dict(v) for k, v in model.items()})
        snapshot = fleet.snapshot()
        check(snapshot, model)
        if rnd.random() < 0.1:
            taken.append((snapshot, {k: dict(v) for k, v in model.items()}))
    for snapshot, then in taken:
        check(snapshot, then)


def test_a_snapshot_after_a_label_change_does_not_walk_the_fleet() -> None:
    fleet = port.GpuFleet({f"n{i}": Counted({"pool": f"p{i % 8}"}) for i in range(5000)})
    Counted.lookups = 0
    assert fleet.snapshot().pool_sizes("pool")["p0"] == 625
    # the first time: the snapshot counts its nodes, the fleet its own, to keep it current
    assert Counted.lookups == 2 * 5000
    Counted.lookups = 0
    for i in range(500):  # a storm labels its nodes; every engine pass takes a snapshot
        fleet.put(f"n{i}", Counted({"pool": f"p{i % 8}", "remediator/state": "cordoned"}))
        assert sum(fleet.snapshot().pool_sizes("pool").values()) == 5000
        assert fleet.snapshot().pool_sizes("pool")[f"p{i % 8}"] == 625
    # recounting the fleet per snapshot was 2,500,000 lookups: now a few per change (the
    # labels compared, the pool moved from and to), none per snapshot
    assert Counted.lookups <= 500 * 10


def test_a_snapshot_is_the_same_object_until_something_changes() -> None:
    fleet = port.GpuFleet({"a": {"pool": "x"}})
    first = fleet.snapshot()
    fleet.put("a", {"pool": "x"})  # the same labels: no change
    assert fleet.snapshot() is first
    fleet.put("a", {"pool": "y"})
    assert fleet.snapshot() is not first
    assert first.pool_sizes("pool") == {"x": 1}
    assert fleet.snapshot().pool_sizes("pool") == {"y": 1}
