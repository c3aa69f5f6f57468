"""The ``remediator`` commands as users run them: separate processes, real files."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys

import pytest

from remediator.sim import testing
from tests.conftest import AM_FIXTURES, ROOT

pytestmark = pytest.mark.e2e


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "remediator", *argv],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_lint_accepts_the_shipped_rules():
    result = run("lint", "rules")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "playbook(s) OK" in result.stdout


def test_lint_reports_problems_with_file_and_path_and_fails(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmatch: {alertname: A}\nsteps:\n  - {id: x, action: nope}\n")
    result = run("lint", str(bad))
    assert result.returncode == 1
    assert f"{bad}: steps.0.action: unknown action 'nope'" in result.stdout


def test_schema_is_json_schema_of_the_playbook_format():
    result = run("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "remediator playbook"
    assert {"name", "steps"} <= set(schema["required"])


def test_migrate_creates_the_schema_at_head(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    result = run("migrate", "--database-url", url)
    assert result.returncode == 0, result.stderr
    assert "database at revision" in result.stdout
    assert "None" not in result.stdout


async def test_plan_reads_the_simulated_cluster_and_changes_nothing(tmp_path):
    async with testing.running_sim() as sim:
        env = {
            "REMEDIATOR_KUBERNETES__MODE": "url",
            "REMEDIATOR_KUBERNETES__URL": sim.url,
            "REMEDIATOR_KUBERNETES__TOKEN": sim.token,
            "REMEDIATOR_LOG_LEVEL": "WARNING",
        }
        fixture = AM_FIXTURES / "GPUXidError79-firing-1alerts.json"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "remediator",
            "plan",
            "--alert",
            str(fixture),
            "--database-url",
            f"sqlite+aiosqlite:///{tmp_path / 'absent.db'}",
            cwd=ROOT,
            env={**__import__("os").environ, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, err.decode()
        plan = json.loads(out)
        assert plan["cluster"] == "connected"
        assert plan["guards"].startswith("not evaluated")
        [alert] = plan["alerts"]
        steps = {s["key"]: s for s in alert["playbooks"][0]["steps"]}
        drain = next(s for s in steps.values() if s["action"] == "node.drain")
        assert "research/jupyter-alice" in str(drain["preview"])
        assert sim.node("gpu-node-03")["spec"].get("unschedulable") in (None, False)
        assert not (tmp_path / "absent.db").exists()


def test_sim_without_tls_writes_a_kubeconfig_outside_the_working_tree_that_kubectl_uses(tmp_path):
    import os
    import shutil

    kubectl = shutil.which("kubectl")
    assert kubectl, "no kubectl: install Debian's kubernetes-client (make system-deps)"
    sim = subprocess.Popen(
        [sys.executable, "-m", "remediator", "sim", "--no-tls", "--listen", "127.0.0.1:0"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert sim.stdout is not None
        lines = [sim.stdout.readline() for _ in range(4)]
        said = "".join(lines)
        assert "serving the Kubernetes API on http://127.0.0.1:" in said
        assert "requests without a token are served" in said
        kubeconfig = pathlib.Path(said.split("export KUBECONFIG=", 1)[1].split()[0])
        assert kubeconfig.is_file()
        assert tmp_path not in kubeconfig.parents
        assert list(tmp_path.iterdir()) == []  # nothing written where it was started
        result = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name"],
            env={**os.environ, "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "node/gpu-node-01" in result.stdout.split()
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    assert sim.returncode == 0
    assert not kubeconfig.exists()  # removed on exit


def test_what_goes_wrong_around_real_processes_is_one_line_and_an_exit_status():
    """The in-process matrix (tests/unit/test_cli_errors.py: every command against a stopped
    server, wrong URLs and tokens, a closed pipe; serve with a bad tokens file) as real
    processes, in parallel: nothing is printed at interpreter exit either (Python's last
    flush of standard output into a closed pipe)."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    stopped = subprocess.Popen(
        [sys.executable, "-m", "remediator", "status", "--server", f"127.0.0.1:{closed_port}"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    piped = {}
    for argv in (["schema"], ["runs", "list", "--help"]):  # into a pipe nobody reads
        read, write = os.pipe()
        os.close(read)
        piped[" ".join(argv)] = subprocess.Popen(
            [sys.executable, "-m", "remediator", *argv],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(write)
    _, err = stopped.communicate(timeout=60)
    assert stopped.returncode == 2
    assert err.startswith(f"remediator: cannot reach the server at 127.0.0.1:{closed_port}: ")
    assert len(err.splitlines()) == 1
    for what, process in piped.items():
        _, err = process.communicate(timeout=60)
        assert (process.returncode, err) == (0, ""), what


def test_serve_migrates_a_new_database_in_a_child_process_once(tmp_path):
    from remediator.adapters.db import migrate
    from tests.e2e.procs import Serve

    env = {
        "REMEDIATOR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}",
        "REMEDIATOR_RULES": str(ROOT / "rules"),
        "REMEDIATOR_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "REMEDIATOR_LOG_LEVEL": "INFO",
        "REMEDIATOR_SHUTDOWN_GRACE": "0.5",
    }
    migrated = f"database migrated to revision {migrate.head_revision()}"
    for start, expected in enumerate((1, 0)):  # the restart finds the schema current
        log = tmp_path / f"serve-{start}.log"
        server = Serve(env=env, log=log).start()
        try:
            assert server.terminate() == 0
        finally:
            server.kill()
        assert log.read_text().count(migrated) == expected, log.read_text()
