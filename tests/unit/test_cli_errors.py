"""The CLI answers what goes wrong around it with one line and an exit status, never a
traceback: a server that does not answer, a URL it cannot use, a closed pipe, a bad tokens
file, an option value that would silently match nothing."""

from __future__ import annotations

import os
import socket
import sys

import pytest

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
    with pytest.raises(SystemExit, match="http:// or https://"):
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
    assert "the tokens file is invalid" in err
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
