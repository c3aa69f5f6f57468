"""The world a benchmark runs in: the simulator as its own process (a generated fleet or a
given one), ``remediator serve`` as users run it with permissive guards, Alertmanager bodies
for any node, and scratch Postgres databases."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import pathlib
import secrets
import shutil
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from bench import ingest, procs

RULES = procs.ROOT / "bench" / "rules"
XID_BODY = ingest.FIXTURES / "GPUXidError79-firing-1alerts.json"
SWEEP_RULE = procs.ROOT / "rules" / "fleet-health-sweep.yaml"

# Every fleet guard out of the way: the benchmarks time the engine, not the guards' holds.
PERMISSIVE = {
    "REMEDIATOR_GUARDS__MAX_NODES": "1000000",
    "REMEDIATOR_GUARDS__MAX_PERCENT": "100",
    "REMEDIATOR_GUARDS__MAX_DISRUPTIVE_RUNS": "1000000",
    "REMEDIATOR_GUARDS__MAX_PER_NODE_PER_DAY": "1000",
    "REMEDIATOR_POLL_INTERVAL": "0.2",
}


@dataclasses.dataclass
class Sim:
    url: str
    token: str
    proc: procs.Proc
    ca_file: pathlib.Path | None
    kubeconfig: pathlib.Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@contextlib.contextmanager
def simulator(
    workdir: pathlib.Path,
    *,
    nodes: int | None = None,
    fleet_file: pathlib.Path | None = None,
    tls: bool = False,
    time_scale: float = 0.05,
    cpu: int | None = 0,
    timeout: float = 300.0,
) -> Iterator[Sim]:
    """``remediator sim`` with ``nodes`` generated GPU nodes (or ``fleet_file``)."""
    token = secrets.token_urlsafe(18)
    port = procs.free_port()
    kubeconfig = workdir / f"sim-{port}.kubeconfig"
    argv = [sys.executable, "-m", "remediator", "sim", "--listen", f"127.0.0.1:{port}"]
    argv += [f"--token={token}", "--kubeconfig", str(kubeconfig), "--time-scale", str(time_scale)]
    argv += ["--nodes", str(nodes)] if nodes else ["--fleet", str(fleet_file)]
    argv += [] if tls else ["--no-tls"]
    ca_file = None
    if tls:
        from remediator.sim import testing

        ca_file = workdir / "sim-ca.crt"
        ca_file.write_bytes(testing.ca_cert_pem())
    scheme = "https" if tls else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    with procs.spawn(argv, log=workdir / f"sim-{port}.log", cpu=cpu) as proc:
        _wait_sim(url, token, proc, timeout, ca_file)
        yield Sim(url=url, token=token, proc=proc, ca_file=ca_file, kubeconfig=kubeconfig)


def _wait_sim(
    url: str, token: str, proc: procs.Proc, timeout: float, ca_file: pathlib.Path | None
) -> None:
    if ca_file is None:
        procs.wait_http(f"{url}/readyz", proc, timeout=timeout)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # the log says when it serves (urllib and our CA)
        if "serving the Kubernetes API" in proc.tail(50):
            return
        if not proc.alive():
            raise RuntimeError(f"simulator exited:\n{proc.tail()}")
        time.sleep(0.2)
    raise RuntimeError(f"simulator did not start within {timeout:.0f} s:\n{proc.tail()}")


def rules_dir(workdir: pathlib.Path) -> pathlib.Path:
    """The benchmark playbooks and the fleet-health sweep runbook."""
    target = workdir / "rules"
    if not target.exists():
        target.mkdir()
        for path in [*RULES.glob("*.yaml"), SWEEP_RULE]:
            shutil.copy(path, target / path.name)
    return target


def serve_env(
    workdir: pathlib.Path, *, database_url: str, sim: Sim | None, worker: str = "bench"
) -> dict[str, str]:
    env = {
        "REMEDIATOR_DATABASE_URL": database_url,
        "REMEDIATOR_RULES": str(rules_dir(workdir)),
        "REMEDIATOR_ARTIFACT_DIR": str(workdir / "artifacts"),
        "REMEDIATOR_LOG_LEVEL": "WARNING",
        "REMEDIATOR_SHUTDOWN_GRACE": "2",
        "REMEDIATOR_WORKER_ID": worker,
        **PERMISSIVE,
    }
    if sim is not None:
        env |= {
            "REMEDIATOR_KUBERNETES__MODE": "url",
            "REMEDIATOR_KUBERNETES__URL": sim.url,
            "REMEDIATOR_KUBERNETES__TOKEN": sim.token,
        }
        if sim.ca_file is not None:
            env["REMEDIATOR_KUBERNETES__CA_FILE"] = str(sim.ca_file)
    return env


@dataclasses.dataclass
class Server:
    url: str
    proc: procs.Proc


@contextlib.contextmanager
def serve(
    workdir: pathlib.Path,
    *,
    database_url: str,
    sim: Sim | None = None,
    cpu: int | None = 1,
    worker: str = "bench",
    extra_env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """``remediator serve`` on a free loopback port (stopped with SIGTERM, then SIGKILL)."""
    port = procs.free_port()
    env = serve_env(workdir, database_url=database_url, sim=sim, worker=worker)
    env |= {"REMEDIATOR_LISTEN": f"127.0.0.1:{port}", **(extra_env or {})}
    argv = [sys.executable, "-m", "remediator", "serve"]
    log = workdir / f"serve-{worker}-{port}.log"
    watches = node_watches(sim) if sim is not None else 0
    with procs.spawn(argv, log=log, env=env, cpu=cpu) as proc:
        url = f"http://127.0.0.1:{port}"
        procs.wait_http(f"{url}/readyz", proc, timeout=120)
        if sim is not None:
            _wait_watching(sim, watches, proc)
        yield Server(url=url, proc=proc)


def node_watches(sim: Sim) -> int:
    """Node watches the simulator has served (its request log)."""
    request = urllib.request.Request(f"{sim.url}/sim/v1/requests", headers=sim.headers)
    context = ssl.create_default_context(cafile=str(sim.ca_file)) if sim.ca_file else None
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return int(json.load(answer).get("watch nodes", 0))


def _wait_watching(sim: Sim, before: int, proc: procs.Proc, timeout: float = 120.0) -> None:
    """Until the new server watches the nodes: its engine lists the GPU fleet when it starts
    (5,800 nodes: a second of its CPU) and then watches it. A measurement starting before
    that would count a start-up's work as the alerts' (a running engine has done it long
    before a storm)."""
    deadline = time.monotonic() + timeout
    while node_watches(sim) <= before:
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server never watched the nodes:\n{proc.tail()}")
        time.sleep(0.1)


def sqlite_url(workdir: pathlib.Path, name: str = "remediator") -> str:
    return f"sqlite+aiosqlite:///{workdir / (name + '.db')}"


@contextlib.contextmanager
def database(workdir: pathlib.Path, backend: str, postgres: str, name: str) -> Iterator[str]:
    """A fresh database: a SQLite file, or a migrated scratch database on ``postgres``."""
    if backend == "sqlite":
        yield sqlite_url(workdir, name)
        return
    with ingest.fresh_postgres(postgres) as url:
        yield url


def postgres_available(server_url: str) -> bool:
    import asyncpg

    async def probe() -> None:
        url = server_url.replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(url, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    return True


_TEMPLATE: dict[str, Any] = json.loads(XID_BODY.read_bytes())


def alert_body(node: str, seq: int, *, status: str = "firing") -> bytes:
    """The real Alertmanager 0.25 Xid 79 delivery, moved to ``node`` as episode ``seq``."""
    body = copy.deepcopy(_TEMPLATE)
    alert = body["alerts"][0]
    labels = alert["labels"]
    labels |= {"node": node, "Hostname": node, "instance": f"{node}:9400"}
    labels.pop("pod", None)
    labels.pop("namespace", None)
    labels.pop("container", None)
    alert["status"] = status
    alert["fingerprint"] = f"{seq:016x}"
    alert["startsAt"] = f"2026-11-30T{seq // 3600 % 24:02d}:{seq // 60 % 60:02d}:{seq % 60:02d}Z"
    body["groupLabels"] = {"alertname": labels["alertname"], "node": node}
    body["commonLabels"] = dict(labels)
    body["groupKey"] = f'{{}}:{{alertname="GPUXidError79", node="{node}"}}'
    return json.dumps(body, separators=(",", ":")).encode()
