"""The README's five-minute tour, run as written (ports swapped for free ones)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import httpx
import pytest

from remediator.demo.processes import free_port
from tests.conftest import ROOT
from tests.e2e.procs import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def tour_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", tour, re.DOTALL)]


def test_the_tour_runs_as_written(tmp_path):
    sim_block, serve_block, post_block, inspect_block = tour_blocks()
    sim_port, serve_port = free_port(), free_port()

    def local(command: str) -> str:
        return (
            command.replace("127.0.0.1:6443", f"127.0.0.1:{sim_port}")
            .replace("127.0.0.1:8080", f"127.0.0.1:{serve_port}")
            .replace(".venv/bin/remediator", f"{sys.executable} -m remediator")
        )

    env = {
        **os.environ,
        "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}",
        "REMEDIATOR_LISTEN": f"127.0.0.1:{serve_port}",
        "REMEDIATOR_LOG_LEVEL": "WARNING",
    }
    sim = subprocess.Popen(
        [
            *shlex.split(local(sim_block)),
            *("--time-scale", "0.02", "--kubeconfig", str(tmp_path / "kubeconfig")),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    serve = subprocess.Popen(
        ["bash", "-c", local(serve_block).replace("\\\n", " ")],
        cwd=ROOT,
        env=env,
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:

        def ready():
            try:
                return httpx.get(f"http://127.0.0.1:{serve_port}/readyz").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 30, what="serve ready")
        posted = subprocess.run(
            ["bash", "-c", local(post_block)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(posted.stdout)["changed"] == 1
        base = f"http://127.0.0.1:{serve_port}"
        wait_for(
            lambda: [
                r
                for r in httpx.get(f"{base}/api/v1/runs").json()["items"]
                if r["status"] == "waiting_approval"
            ],
            30,
            what="drain waits",
        )
        commands = [c for c in local(inspect_block).replace("\\\n", " ").splitlines() if c.strip()]
        outputs = []
        for command in commands:
            done = subprocess.run(
                ["bash", "-c", command.split("#")[0]],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0, done.stderr
            outputs.append(json.loads(done.stdout))
        runs, plan, approved, _ = outputs
        assert runs["items"][0]["status"] == "waiting_approval"
        planned = {s["key"]: s for s in plan["steps"]}
        assert planned["drain-gpu"]["status"] == "succeeded"  # the lost GPU's pod went at once
        assert "research/jupyter-alice" not in planned["drain"]["preview"]["evict"]
        assert planned["drain"]["status"] == "waiting_approval"
        assert approved["status"] == "pending"

        def finished():
            run = httpx.get(f"{base}/api/v1/runs/1").json()
            return run if run["status"] in ("succeeded", "failed") else None

        run = wait_for(finished, 60, what="run finished")
        steps = {s["key"]: s for s in run["steps"]}
        assert run["status"] == "succeeded", steps
        assert steps["drain"]["status"] == "succeeded"
        assert steps["bug-report"]["output"].get("sha256")
        actors = {e["actor"] for e in run["events"]}
        assert "anonymous" in actors  # the approval, by whoever approved
    finally:
        for process in (serve, sim):
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        time.sleep(0)
