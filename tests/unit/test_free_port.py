"""``free_port`` (the demo's, which the tests and benchmarks use too): the port handed to a
child process to listen on must stay free until the child binds it, even while other sockets
connect out."""

from __future__ import annotations

import random
import socket

import pytest

from remediator.demo import processes as procs


def test_the_port_is_below_the_range_outgoing_connections_draw_from() -> None:
    floor = procs._ephemeral_floor()
    for _ in range(20):
        port = procs.free_port()
        assert 10_000 <= port < floor
        with socket.socket() as listener:
            listener.bind((procs.LOOPBACK, port))  # free for the child to listen on
            listener.listen()


def test_workers_that_reseed_random_alike_still_pick_apart() -> None:
    random.seed(7)
    first = [procs.free_port() for _ in range(5)]
    random.seed(7)
    second = [procs.free_port() for _ in range(5)]
    assert first != second


def test_a_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind((procs.LOOPBACK, procs.free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        free = procs.free_port()
        picks = iter([busy, free])
        monkeypatch.setattr(procs._PICK, "randrange", lambda low, high: next(picks))
        assert procs.free_port() == free


def test_an_ephemeral_range_that_leaves_no_room_below_gets_the_kernels_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(procs, "_ephemeral_floor", lambda: 1024)
    port = procs.free_port()
    with socket.socket() as listener:
        listener.bind((procs.LOOPBACK, port))
