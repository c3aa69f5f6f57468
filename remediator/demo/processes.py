"""The demo's world: the simulated cluster in this process, ``remediator serve`` as a child
process on loopback with a generated tokens file, both stopped by PID on the way out."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import hashlib
import os
import pathlib
import random
import secrets
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable

import httpx
import yaml
from aiohttp import web

from remediator.sim import api as sim_api
from remediator.sim import cluster as sim_cluster
from remediator.sim import fleet as sim_fleet
from remediator.sim import server as sim_server
from remediator.sim import testing as sim_testing

# Real seconds per simulated second: a 30 s grace period lasts 3 s, a bug report 0.5 s.
TIME_SCALE = 0.1
LOOPBACK = "127.0.0.1"

# What the server is told through its environment, with the reason shown to the user.
SERVER_TUNING: tuple[tuple[str, str, str], ...] = (
    (
        "REMEDIATOR_GUARDS__MAX_PERCENT",
        "100",
        "the disruption budget allows every node: the demo fleet has four GPU nodes and "
        "the scenario takes two out (the default budget would hold the second)",
    ),
    ("REMEDIATOR_POLL_INTERVAL", "0.2", "the engine polls every 0.2 s"),
    ("REMEDIATOR_LEASE_SECONDS", "3", "step leases of 3 s: drain progress is saved every 1 s"),
)


class DemoError(Exception):
    """Something the scenario needed did not happen; the message says what."""


@dataclasses.dataclass(frozen=True)
class Tokens:
    ingest: str
    operator: str
    auditor: str

    @classmethod
    def generate(cls) -> Tokens:
        return cls(*(f"demo-{secrets.token_urlsafe(18)}" for _ in range(3)))

    def write(self, path: pathlib.Path) -> None:
        entries = [
            {
                "name": name,
                "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
                "roles": [role],
            }
            for name, token, role in (
                ("alertmanager", self.ingest, "ingest"),
                ("demo-operator", self.operator, "operator"),
                ("demo-auditor", self.auditor, "auditor"),
            )
        ]
        path.write_text(yaml.safe_dump(entries, sort_keys=False), encoding="utf-8")
        path.chmod(0o600)


@dataclasses.dataclass
class Sim:
    url: str
    token: str
    kubeconfig: pathlib.Path
    ca_file: pathlib.Path
    app: web.Application

    @property
    def cluster(self) -> sim_cluster.Cluster:
        return self.app[sim_api.CLUSTER]


@contextlib.asynccontextmanager
async def simulator(workdir: pathlib.Path) -> AsyncIterator[Sim]:
    """The default GPU fleet over HTTPS (kubectl sends tokens only over TLS) on loopback."""
    token = secrets.token_urlsafe(18)
    app = sim_server.create_app(sim_fleet.Fleet.default(), token=token, time_scale=TIME_SCALE)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, LOOPBACK, 0, ssl_context=sim_testing.server_ssl_context())
        await site.start()
        url = f"https://{LOOPBACK}:{runner.addresses[0][1]}"
        kubeconfig = sim_testing.write_kubeconfig(workdir / "sim.kubeconfig", url, token)
        ca_file = workdir / "sim-ca.crt"
        ca_file.write_bytes(sim_testing.ca_cert_pem())
        yield Sim(url=url, token=token, kubeconfig=kubeconfig, ca_file=ca_file, app=app)
    finally:
        await runner.cleanup()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _exit_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send SIGTERM to the child when the demo dies, even by
    SIGKILL (no ``finally`` runs then); elsewhere ``None`` and the ``finally`` is all there is."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the demo died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


_LOWEST_PORT = 10_000
_PICK = random.SystemRandom()  # the test runner reseeds ``random`` alike in every worker


def _ephemeral_floor() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback port nothing listens on, for a child process to listen on later.

    It comes from below the kernel's ephemeral range: a port ``bind(0)`` hands out is one that
    every outgoing connection on the machine draws from as well, so in the seconds before the
    child binds it a client socket (a probe, a scrape, a webhook) can take it and the child
    fails with "address already in use". Below the range only another listener can race for
    it, and the pick is random so parallel workers rarely meet. On a machine whose ephemeral
    range starts too low to leave such ports, the kernel's pick.
    """
    ceiling = _ephemeral_floor()
    if ceiling < _LOWEST_PORT + 1000:
        with socket.socket() as sock:
            sock.bind((LOOPBACK, 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = _PICK.randrange(_LOWEST_PORT, ceiling)
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {_LOWEST_PORT} and {ceiling}")


@dataclasses.dataclass
class Server:
    url: str
    log: pathlib.Path
    artifacts: pathlib.Path
    process: asyncio.subprocess.Process

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def server_env(
    *, workdir: pathlib.Path, rules: pathlib.Path, sim: Sim, tokens_file: pathlib.Path, port: int
) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("REMEDIATOR_")}
    env.update(
        {
            "REMEDIATOR_LISTEN": f"{LOOPBACK}:{port}",
            "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'remediator.db'}",
            "REMEDIATOR_RULES": str(rules),
            "REMEDIATOR_TOKENS": str(tokens_file),
            "REMEDIATOR_ARTIFACT_DIR": str(workdir / "artifacts"),
            "REMEDIATOR_LOG_FORMAT": "text",
            "REMEDIATOR_SHUTDOWN_GRACE": "2",
            "REMEDIATOR_KUBERNETES__MODE": "url",
            "REMEDIATOR_KUBERNETES__URL": sim.url,
            "REMEDIATOR_KUBERNETES__TOKEN": sim.token,
            "REMEDIATOR_KUBERNETES__CA_FILE": str(sim.ca_file),
        }
    )
    env.update({name: value for name, value, _ in SERVER_TUNING})
    return env


@contextlib.asynccontextmanager
async def server(
    *, workdir: pathlib.Path, rules: pathlib.Path, sim: Sim, tokens: Tokens
) -> AsyncIterator[Server]:
    """``remediator serve`` exactly as users run it; stopped with SIGTERM (then SIGKILL)."""
    tokens_file = workdir / "tokens.yaml"
    tokens.write(tokens_file)
    port = free_port()
    env = server_env(workdir=workdir, rules=rules, sim=sim, tokens_file=tokens_file, port=port)
    log = workdir / "serve.log"
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "remediator",
            "serve",
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_exit_with_parent(os.getpid()),
        )
    running = Server(f"http://{LOOPBACK}:{port}", log, workdir / "artifacts", process)
    try:
        await _wait_ready(running)
        yield running
    finally:
        await _stop(process)


async def _wait_ready(running: Server, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with httpx.AsyncClient(base_url=running.url, timeout=2.0) as client:
        while loop.time() < deadline:
            if running.process.returncode is not None:
                raise DemoError(
                    f"remediator serve exited with {running.process.returncode}:\n{running.tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise DemoError(f"remediator serve was not ready after {timeout:g} s:\n{running.tail()}")


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=15)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
