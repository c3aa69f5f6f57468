"""Start the simulator in-process for tests: ``async with running_sim() as sim: ...``.

``sim.url``/``sim.token``/``sim.kubeconfig_path`` point clients at it; ``sim.cluster`` (store,
GPU hosts, pod files, settings) allows direct inspection and manipulation of state.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import importlib.resources
import pathlib
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from remediator.sim import api, nvidia, persist, server
from remediator.sim import cluster as cluster_mod
from remediator.sim import fleet as fleet_mod
from remediator.sim import store as store_mod

CONTEXT = "remediator-sim"
# A self-signed certificate for 127.0.0.1, ::1 and localhost, shipped with its key: it
# protects nothing and exists because kubectl only sends bearer tokens over TLS.
TLS_DIR = importlib.resources.files("remediator.sim").joinpath("tls")


def ca_cert_pem() -> bytes:
    return TLS_DIR.joinpath("cert.pem").read_bytes()


def server_ssl_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with (
        importlib.resources.as_file(TLS_DIR.joinpath("cert.pem")) as cert,
        importlib.resources.as_file(TLS_DIR.joinpath("key.pem")) as key,
    ):
        context.load_cert_chain(cert, key)
    return context


def kubeconfig(url: str, token: str, *, namespace: str = "default") -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": url}
    if url.startswith("https:"):
        cluster["certificate-authority-data"] = base64.b64encode(ca_cert_pem()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": cluster}],
        "users": [{"name": CONTEXT, "user": {"token": token}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: str | pathlib.Path, url: str, token: str) -> pathlib.Path:
    import yaml

    target = pathlib.Path(path)
    target.write_text(yaml.safe_dump(kubeconfig(url, token), sort_keys=False), encoding="utf-8")
    target.chmod(0o600)
    return target


@dataclasses.dataclass
class RunningSim:
    url: str
    token: str
    kubeconfig_path: pathlib.Path
    app: web.Application
    runner: web.AppRunner
    ca_cert_path: pathlib.Path | None = None
    """PEM file to trust when serving TLS (``None`` over plain HTTP)."""
    workdir: pathlib.Path | None = None
    """Where the kubeconfig and CA file live; removed by ``stop``."""
    state_file: pathlib.Path | None = None
    """Where ``stop`` saves the cluster state for the next simulator (``None``: nowhere)."""

    @property
    def cluster(self) -> cluster_mod.Cluster:
        return self.app[api.CLUSTER]

    @property
    def store(self) -> store_mod.Store:
        return self.cluster.store

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def gpu(self, node: str, index: int) -> nvidia.Gpu:
        gpu = self.cluster.gpu(node, index)
        if gpu is None:
            raise KeyError(f"{node}/gpu{index}")
        return gpu

    def node(self, name: str) -> dict[str, Any]:
        return self.store.must_get("nodes", "", name)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store.get("pods", namespace, name)

    def pods(
        self, *, node: str | None = None, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            p
            for p in self.store.list("pods", namespace)
            if node is None or p["spec"].get("nodeName") == node
        ]

    def files(self, namespace: str, pod: str) -> dict[str, bytes]:
        obj = self.pod(namespace, pod)
        if obj is None:
            raise KeyError(f"{namespace}/{pod}")
        return self.cluster.files.setdefault(obj["metadata"]["uid"], {})

    def driver_pod(self, node: str) -> dict[str, Any]:
        """The GPU Operator driver pod running on ``node``."""
        for pod in self.pods(node=node, namespace="gpu-operator"):
            if (pod["metadata"].get("labels") or {}).get("app") == "nvidia-driver-daemonset":
                return pod
        raise KeyError(f"no driver pod on {node}")

    async def wait_for(
        self, predicate: Callable[[], bool], *, timeout: float = 5.0, interval: float = 0.01
    ) -> None:
        """Poll ``predicate`` until it is true; raise ``TimeoutError`` after ``timeout``."""
        async with asyncio.timeout(timeout):
            while not predicate():  # noqa: ASYNC110 - polls state other tasks change
                await asyncio.sleep(interval)

    async def stop(self) -> None:
        await self.runner.cleanup()
        if self.state_file is not None:
            persist.save(self.cluster, self.state_file)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


async def start_sim(
    fleet: fleet_mod.Fleet | None = None,
    *,
    token: str = "sim-token",  # noqa: S107 - a test fixture's token
    time_scale: float | None = 0.01,
    host: str = "127.0.0.1",
    port: int = 0,
    kubeconfig_path: str | pathlib.Path | None = None,
    tls: bool = False,
    state_file: str | pathlib.Path | None = None,
    restore: persist.Restore = "all",
    anonymous: bool = False,
) -> RunningSim:
    """Start the simulator on ``host:port`` (0: ephemeral) and write a kubeconfig for it.

    ``time_scale`` defaults to 0.01 (a 30 s grace period lasts 0.3 s); ``None`` keeps the
    fleet's own setting. ``tls`` serves HTTPS with the bundled self-signed certificate (needed
    by kubectl, which sends bearer tokens only over TLS). ``state_file``: restore the cluster
    saved there, if any (``restore="gpus"``: only its GPUs), and save it there on ``stop``
    (see ``persist``). ``anonymous``: requests without credentials are served too (kubectl
    sends none over plain HTTP).
    """
    state = persist.load(state_file) if state_file is not None else None
    app = server.create_app(
        fleet or fleet_mod.Fleet.default(),
        token=token,
        time_scale=time_scale,
        state=state,
        restore=restore,
        anonymous=anonymous,
    )
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=server_ssl_context() if tls else None)
    await site.start()
    bound = runner.addresses[0][1]
    url = f"{'https' if tls else 'http'}://{host}:{bound}"
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="remediator-sim-"))
    if kubeconfig_path is None:
        kubeconfig_path = workdir / "kubeconfig"
    path = write_kubeconfig(kubeconfig_path, url, token)
    ca_path = None
    if tls:
        ca_path = workdir / "ca.crt"
        ca_path.write_bytes(ca_cert_pem())
    return RunningSim(
        url=url,
        token=token,
        kubeconfig_path=path,
        app=app,
        runner=runner,
        ca_cert_path=ca_path,
        workdir=workdir,
        state_file=pathlib.Path(state_file) if state_file is not None else None,
    )


@contextlib.asynccontextmanager
async def running_sim(
    fleet: fleet_mod.Fleet | None = None, **kwargs: Any
) -> AsyncIterator[RunningSim]:
    sim = await start_sim(fleet, **kwargs)
    try:
        yield sim
    finally:
        await sim.stop()
