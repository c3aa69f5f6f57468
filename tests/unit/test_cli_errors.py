"""The CLI answers what goes wrong around it with one line and an exit status, never a
traceback: a server that does not answer, a URL it cannot use, a closed pipe, a bad tokens
file, an option value that would silently match nothing."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest
from aiohttp import web

from remediator import cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_that_does_not_answer_is_one_line_and_status_2(capsys):
    port = _closed_port()
    code = cli.main(["runs", "list", "--server", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"remediator: cannot reach the server at 127.0.0.1:{port}: ")
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_server_defaults_to_the_address_serve_listens_on(monkeypatch):
    monkeypatch.delenv("REMEDIATOR_SERVER", raising=False)
    args = cli.build_parser().parse_args(["breaker", "status"])
    assert cli.server_url(args.server) == "http://127.0.0.1:8080"
    # audit verify reads the database unless a server is named
    verify = cli.build_parser().parse_args(["audit", "verify"])
    assert verify.server is None


@pytest.mark.parametrize(
    ("given", "url"),
    [("127.0.0.1:8080", "http://127.0.0.1:8080"), ("https://rm.example", "https://rm.example")],
)
def test_a_host_and_port_or_an_http_url_is_a_server(given, url):
    assert cli.server_url(given) == url


def test_another_scheme_is_refused_with_a_message():
    with pytest.raises(ValueError, match="http:// or https://"):
        cli.server_url("ftp://rm.example")


def test_a_status_that_does_not_exist_is_refused_instead_of_matching_nothing(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["runs", "list", "--status", "done"])
    assert exited.value.code == 2
    assert "invalid choice: 'done'" in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly(monkeypatch, tmp_path):
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", stream)
    export = tmp_path / "export.jsonl"
    export.write_text('{"trailer": {"filtered": false, "count": 0}}\n')
    try:
        assert cli.main(["audit", "verify", "--file", str(export)]) == 0
    finally:
        monkeypatch.undo()
        stream.close()


def test_a_bad_tokens_file_names_each_problem_and_no_token(tmp_path, capsys):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("- name: ci\n  tokn: s3cr3t-value-that-must-not-show\n")
    code = cli.main(
        [
            "serve",
            "--tokens",
            str(tokens),
            "--database-url",
            f"sqlite+aiosqlite:///{tmp_path / 'r.db'}",
            "--rules",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("remediator: the tokens file is invalid: ")
    assert len(err.strip().splitlines()) == 1
    assert "entry 0.tokn: Extra inputs are not permitted" in err
    assert "s3cr3t" not in err
    assert "Traceback" not in err


def _plan(tmp_path, *extra):
    from tests.conftest import AM_FIXTURES, ROOT

    return cli.main(
        [
            "plan",
            "--alert",
            str(AM_FIXTURES / "GPUXidError79-firing-1alerts.json"),
            "--database-url",
            f"sqlite+aiosqlite:///{tmp_path / 'absent.db'}",
            "--rules",
            str(ROOT / "rules"),
            *extra,
        ]
    )


def test_a_plan_without_cluster_settings_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("REMEDIATOR_KUBERNETES__MODE", raising=False)
    code = _plan(tmp_path)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "no `kubernetes` setting" in captured.err
    assert "--offline" in captured.err


def test_an_offline_plan_says_it_shows_no_live_state(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("REMEDIATOR_KUBERNETES__MODE", raising=False)
    code = _plan(tmp_path, "--offline", "--output", "json")
    captured = capsys.readouterr()
    assert code == 0
    assert "not configured (no live state)" in captured.out
    assert "--offline, so the plan shows no live state" in captured.err


# -- every command, everything that can go wrong around it ------------------------------------

GOOD_TOKEN = "good-token"
SERVER_COMMANDS = [
    ["status"],
    ["runs", "list"],
    ["runs", "show", "1"],
    ["runs", "approve", "1", "2", "--comment", "ok"],
    ["runs", "reject", "1", "2", "--comment", "no"],
    ["runbook", "trigger", "return-node-to-service", "--node", "gpu-node-01"],
    ["breaker", "status"],
    ["breaker", "reset", "--comment", "ok"],
    ["audit", "export"],
    ["audit", "verify"],  # asks the server when given --server
]


def _leaf_commands(parser, prefix=()):
    import argparse

    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        yield prefix, parser
        return
    for name, child in actions[0].choices.items():
        yield from _leaf_commands(child, (*prefix, name))


def test_the_matrix_covers_every_command_that_talks_to_a_server():
    talking = [
        path
        for path, parser in _leaf_commands(cli.build_parser())
        if any("--server" in a.option_strings for a in parser._actions)
    ]
    assert talking
    for path in talking:
        assert any(tuple(argv[: len(path)]) == path for argv in SERVER_COMMANDS), path


async def _answer(request: web.Request) -> web.StreamResponse:
    """A remediator server as far as the CLI can tell: the API's answers in their shapes."""
    if request.headers.get("Authorization") != f"Bearer {GOOD_TOKEN}":
        body = {"error": {"code": "unauthorized", "message": "unknown token"}}
        return web.json_response(body, status=401)
    path = request.path
    if path == "/api/v1/audit/export":
        return web.Response(text='{"id": 1}\n' * 200, content_type="application/x-ndjson")
    if path == "/api/v1/audit/verify":
        return web.json_response({"ok": True, "checked": 3})
    if path == "/api/v1/runs":
        return web.json_response({"items": [{"id": 1, "status": "succeeded"}] * 50})
    return web.json_response({"path": path, "lines": list(range(500))})


async def _not_remediator(request: web.Request) -> web.Response:
    return web.Response(
        text="<html>\n<body>\nsomething else\n</body>\n</html>\n",
        status=200,
        content_type="text/html",
    )


async def _serve(aiohttp_server, handler):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}"


@pytest.fixture(autouse=True)
def _no_log_handlers_of_earlier_commands(monkeypatch):
    """``serve`` configures logging for its process; in this one it would outlive the test
    whose stderr it writes to."""
    import logging

    monkeypatch.setattr(logging.root, "handlers", [])


def _run(argv, capsys, *, stdout=None):
    """``cli.main`` as a process runs it: SystemExit's message goes to stderr."""
    if stdout is not None:
        sys.stdout = stdout
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    finally:
        sys.stdout = sys.__stdout__ if stdout is None else sys.stdout
    return code, capsys.readouterr().err


def _with_server(argv, server, token=GOOD_TOKEN):
    return [*argv, "--server", server, "--token", token]


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


async def test_every_server_command_fails_in_one_line_whatever_is_wrong(aiohttp_server, capsys):
    other = await _serve(aiohttp_server, _not_remediator)
    remediator = await _serve(aiohttp_server, _answer)
    cases = {
        "stopped server": (f"127.0.0.1:{_closed_port()}", GOOD_TOKEN, 2, "cannot reach the server"),
        "unusable scheme": ("ftp://127.0.0.1", GOOD_TOKEN, 2, "http:// or https://"),
        "no host": ("http://:8080", GOOD_TOKEN, 2, "names no host"),
        "not a URL": ("http://[::1", GOOD_TOKEN, 2, "not a usable URL"),
        "another server": (other, GOOD_TOKEN, 1, "is this a remediator server?"),
        "wrong path": (f"{remediator}/nothing-here", "bad", 1, "HTTP 401: unauthorized"),
        "wrong token": (remediator, "bad-token", 1, "HTTP 401: unauthorized: unknown token"),
    }
    for what, (server, token, status, says) in cases.items():
        for argv in SERVER_COMMANDS:
            code, err = await asyncio.to_thread(_run, _with_server(argv, server, token), capsys)
            line = _one_line(err)
            assert (code, says in line) == (status, True), (what, argv, line)
            assert line.startswith("remediator: "), (what, argv, line)


async def test_every_command_into_a_closed_pipe_stops_quietly(aiohttp_server, capsys, tmp_path):
    from tests.conftest import AM_FIXTURES, ROOT

    remediator = await _serve(aiohttp_server, _answer)
    export = tmp_path / "export.jsonl"
    export.write_text('{"trailer": {"filtered": false, "count": 0}}\n')
    local = [
        ["schema"],
        ["lint", str(ROOT / "rules")],
        ["migrate", "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"],
        ["audit", "verify", "--file", str(export)],
        [
            "plan",
            "--offline",
            "--rules",
            str(ROOT / "rules"),
            "--alert",
            str(AM_FIXTURES / "GPUXidError79-firing-1alerts.json"),
            "--database-url",
            f"sqlite+aiosqlite:///{tmp_path / 'absent.db'}",
        ],
    ]
    commands = [_with_server(argv, remediator) for argv in SERVER_COMMANDS] + local
    for argv in commands:
        read, write = os.pipe()
        os.close(read)
        with os.fdopen(write, "w", buffering=1) as closed:
            code, err = await asyncio.to_thread(_run, argv, capsys, stdout=closed)
        assert code == 0, (argv, err)
        assert "Traceback" not in err
        assert "BrokenPipe" not in err
