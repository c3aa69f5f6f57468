"""The real app on a real listening socket in a process of its own (the engine not running):
``python -m tests.support.live '<settings as JSON>'`` prints ``port <n>`` once it listens
and serves until terminated. ``LiveProcess`` starts and stops one."""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
import sys
from typing import Any

from aiohttp import web

import remediator.app as app_mod
from remediator.app import logs
from remediator.app import settings as settings_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]


async def _serve(settings: settings_mod.Settings) -> None:
    logs.configure(settings.log_level, settings.log_format)
    app = app_mod.create_app(settings, run_engine=False)
    runner = web.AppRunner(app, **app_mod.SERVER_OPTIONS)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"port {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


class LiveProcess:
    """``python -m tests.support.live`` with these settings; its log goes to ``log``."""

    def __init__(self, settings: dict[str, Any], *, log: pathlib.Path) -> None:
        self.settings = settings
        self.log = log
        self.port = 0

    def __enter__(self) -> LiveProcess:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.live", json.dumps(self.settings)],
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=ROOT,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert line.startswith("port "), f"the server did not start: {self.log_tail()}"
        self.port = int(line.split()[1])
        return self

    def log_tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:]

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()


if __name__ == "__main__":
    asyncio.run(_serve(settings_mod.Settings(**json.loads(sys.argv[1]))))
