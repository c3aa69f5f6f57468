"""What a process imports to start: the heavy libraries only where they are used.

kubernetes_asyncio's generated client (every API and model class) costs ~0.6 s and ~37 MB: the
client is imported only when a cluster is configured, and then without the generated classes
(the adapter calls the ``ApiClient`` with its own paths and reads JSON). httpx is imported for
the first notification, silence or hook call, not at start-up. The operator commands that only
talk HTTP load no server stack at all. Checked in a fresh interpreter, by the modules loaded,
not by timing.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER_STACK = ("kubernetes_asyncio", "sqlalchemy", "aiohttp.web", "remediator.app")


def _loaded_after(script: str, *watched: str, below: tuple[str, ...] = ()) -> list[str]:
    """Run ``script`` in a fresh interpreter; the ``watched`` modules it left loaded, and any
    module whose name starts with one of the ``below`` prefixes."""
    code = textwrap.dedent(script) + textwrap.dedent(
        f"""
        import json as _json, sys as _sys
        _found = [name for name in {list(watched)!r} if name in _sys.modules]
        _found += sorted(name for name in _sys.modules if name.startswith({below!r}))
        print(_json.dumps(_found))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_serving_without_a_cluster_never_imports_kubernetes_asyncio(tmp_path: pathlib.Path) -> None:
    script = f"""
        import asyncio
        from aiohttp import web
        import remediator.app as app_mod
        from remediator.app import settings

        config = settings.load(
            database_url="sqlite+aiosqlite:///{tmp_path / "remediator.db"}",
            rules="{ROOT / "rules"}",
        )
        assert config.kubernetes is None

        async def start_and_stop() -> None:
            runner = web.AppRunner(app_mod.create_app(config))
            await runner.setup()
            await runner.cleanup()

        asyncio.run(start_and_stop())
    """
    assert _loaded_after(script, "kubernetes_asyncio", "sqlalchemy") == ["sqlalchemy"]


def test_cluster_settings_import_no_client_until_connecting() -> None:
    settings = """
        import asyncio
        from remediator.adapters import kubernetes

        config = kubernetes.KubernetesConfig(mode="url", url="http://127.0.0.1:1")
        assert config.resolved_mode() == "url"
    """
    connecting = """
        async def connect_and_close() -> None:
            await (await kubernetes.connect(config)).close()

        asyncio.run(connect_and_close())
    """
    assert _loaded_after(settings, "kubernetes_asyncio") == []
    assert _loaded_after(settings + connecting, "kubernetes_asyncio") == ["kubernetes_asyncio"]


GENERATED_CLIENT = ("kubernetes_asyncio.client.api.", "kubernetes_asyncio.client.models.")


def test_serving_with_a_cluster_imports_none_of_the_generated_client(
    tmp_path: pathlib.Path,
) -> None:
    """The app started against the simulator (its leader lease included), then every kind of
    call the adapter makes: reads, lists, patches, creates, an eviction, a websocket exec and a
    lease. None loads an API or model class of kubernetes_asyncio, and nothing loads httpx."""
    script = f"""
        import asyncio
        from aiohttp import web
        import remediator.app as app_mod
        from remediator.app import settings
        from remediator.adapters import kubernetes
        from remediator.ports import cluster as port
        from remediator.sim import testing

        async def main() -> None:
            async with testing.running_sim(time_scale=0.01) as sim:
                config = settings.load(
                    database_url="sqlite+aiosqlite:///{tmp_path / "remediator.db"}",
                    rules="{ROOT / "rules"}",
                    kubernetes={{"mode": "url", "url": sim.url, "token": sim.token}},
                )
                assert config.kubernetes is not None
                runner = web.AppRunner(app_mod.create_app(config))
                await runner.setup()
                kube = await kubernetes.connect(config.kubernetes)
                try:
                    assert await kube.list_nodes(kube.gpu_node_selector)
                    node = await kube.patch_node("gpu-node-01", unschedulable=True)
                    assert node.unschedulable
                    await kube.create_event(
                        target=port.ObjectRef(kind="Node", name="gpu-node-01"),
                        reason="Checked",
                        message="checked",
                    )
                    driver = await kube.find_driver_pod("gpu-node-01")
                    assert driver is not None
                    done = await kube.exec(
                        namespace=driver.namespace,
                        pod=driver.name,
                        container=kube.driver_container,
                        argv=["nvidia-smi", "-L"],
                        timeout=10,
                    )
                    assert done.exit_code == 0, done
                    [victim, *_] = await kube.list_pods(
                        field_selector="spec.nodeName=gpu-node-02"
                    )
                    evicted = await kube.evict_pod(victim.namespace, victim.name)
                    assert evicted.outcome in (
                        port.EvictionOutcome.EVICTED,
                        port.EvictionOutcome.BLOCKED,
                    ), evicted
                    assert await kube.list_pdbs() is not None
                finally:
                    await kube.close()
                lease = await kubernetes.connect_lease(
                    config.kubernetes, name="imports", namespace="default"
                )
                try:
                    assert await lease.acquire_or_renew("me", duration=15)
                    await lease.release("me")
                finally:
                    await lease.close()
                await runner.cleanup()

        asyncio.run(main())
    """
    loaded = _loaded_after(script, "kubernetes_asyncio", "httpx", below=GENERATED_CLIENT)
    assert loaded == ["kubernetes_asyncio"]


def test_the_rest_of_kubernetes_asyncio_still_loads_for_whoever_asks_for_it() -> None:
    """The adapter registers the client's packages without their ``__init__``; asking one for a
    name it does not have runs it then, so other code sees the whole library, the same objects."""
    script = """
        from remediator.adapters.kubernetes import library
        from kubernetes_asyncio import client, watch
        from kubernetes_asyncio.client.models import V1Node

        assert client.ApiClient is library.ApiClient
        assert client.ApiException is library.ApiException
        assert client.api.PolicyV1Api is client.PolicyV1Api
        assert client.V1Node is V1Node is client.models.V1Node
        node = client.V1Node(metadata=client.V1ObjectMeta(name="n"))
        assert node.to_dict()["metadata"]["name"] == "n"
        assert callable(watch.Watch)
    """
    watched = ("kubernetes_asyncio.client.api.core_v1_api", "kubernetes_asyncio.watch")
    assert _loaded_after(script, *watched) == list(watched)


def test_operator_commands_over_http_load_no_server_stack() -> None:
    script = """
        import http.server, threading
        from remediator import cli

        class Api(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"items": [], "nextCursor": null}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert cli.main(["runs", "list", "--server", url, "--output", "json"]) == 0
        server.shutdown()
    """
    assert _loaded_after(script, *SERVER_STACK) == []


def test_the_command_line_help_loads_no_server_stack() -> None:
    script = """
        import contextlib, io
        from remediator import cli

        for argv in (["--help"], ["runs", "--help"], ["sim", "--help"]):
            with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
                cli.main(argv)
    """
    assert _loaded_after(script, *SERVER_STACK, "aiohttp") == []
