"""What a process imports to start: the heavy libraries only where they are used.

kubernetes_asyncio's generated client (every API and model class) costs ~0.6 s and ~40 MB, so it
is imported only when a cluster is configured; the operator commands that only talk HTTP load
no server stack at all. Checked in a fresh interpreter, by the modules loaded, not by timing.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER_STACK = ("kubernetes_asyncio", "sqlalchemy", "aiohttp.web", "remediator.app")


def _loaded_after(script: str, *watched: str) -> list[str]:
    """Run ``script`` in a fresh interpreter; the ``watched`` modules it left loaded."""
    code = textwrap.dedent(script) + textwrap.dedent(
        f"""
        import json as _json, sys as _sys
        print(_json.dumps([name for name in {list(watched)!r} if name in _sys.modules]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
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
