"""Real ``remediator`` processes for end-to-end tests: started, probed, killed by PID."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from remediator.demo.processes import free_port
from tests.conftest import ROOT


class Serve:
    """One ``remediator serve`` process."""

    def __init__(self, *, env: dict[str, str], log: pathlib.Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env, "REMEDIATOR_LISTEN": f"127.0.0.1:{self.port}"}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> Serve:
        stream = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "remediator", "serve"],
            env=self.env,
            cwd=ROOT,
            stdout=stream,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(f"serve not ready after {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def post(self, body: bytes) -> httpx.Response:
        return httpx.post(
            f"{self.url}/api/v1/alerts",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=10,
        )

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        response.raise_for_status()
        return response.json()


def wait_for(predicate: Any, timeout: float, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")


def alert(node: str, *, alertname: str = "GPUXidError79", status: str = "firing") -> bytes:
    fingerprint = f"{abs(hash((alertname, node))) % 16**16:016x}"
    body = {
        "version": "4",
        "status": status,
        "receiver": "e2e",
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": alertname, "node": node, "severity": "critical"},
                "annotations": {"summary": f"{alertname} on {node}"},
                "startsAt": "2026-11-30T00:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": fingerprint,
            }
        ],
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "",
        "groupKey": node,
        "truncatedAlerts": 0,
    }
    return json.dumps(body).encode()
