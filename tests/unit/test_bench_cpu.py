"""``bench.procs.named_cpu_seconds``: the CPU of every live process of one name (the bench
adds up Postgres's server and backends with it)."""

from __future__ import annotations

import os
import pathlib
import time

from bench import procs


def _own() -> tuple[str, float]:
    text = pathlib.Path("/proc/self/stat").read_text()
    name = text[text.find("(") + 1 : text.rfind(")")]
    fields = text[text.rfind(")") + 1 :].split()
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_cpu_of_processes_of_a_name_counts_this_one() -> None:
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # some CPU of our own to find
        pass
    name, own = _own()
    assert own > 0
    assert procs.named_cpu_seconds(name) >= own


def test_no_process_of_a_name_is_no_cpu() -> None:
    assert procs.named_cpu_seconds("no-such-process-name") == 0


def test_the_cpu_an_alert_adds_up_every_process() -> None:
    from bench import stages

    used = stages._Used(servers=4.6, sim=1.8, postgres=1.7)
    assert round(used.per_alert_ms(1000), 6) == 8.1
    assert used.per_alert_ms(0) == 8100.0  # no alert: never a division by zero


def test_the_most_the_cores_carry_is_their_time_over_the_cpu_an_alert() -> None:
    from bench import stages

    used = stages._Used(servers=5.2, sim=1.8, postgres=1.8)  # 8.8 ms an alert
    assert round(used.most_per_second(1000, cores=2), 1) == 227.3
    assert round(used.most_per_second(1000, cores=4), 1) == 454.5


def test_the_cores_a_burst_kept_busy_bound_what_replicas_can_add() -> None:
    from bench import stages

    busy = stages.cores_busy(7.1, 202.1)  # the fast-hour run: 7.1 ms an alert, 202 alerts/s
    assert round(busy, 2) == 1.43
    assert round(2 / busy, 2) == 1.39  # 2 cores: no second replica could reach 1.6x
    assert stages.cores_busy(0.0, 500.0) == 0.0
