"""The operator commands: ``status``, ``runs``, ``runbook``, ``breaker`` and ``audit`` talk to a
server's API with a token and print its answers as a table (on a terminal), JSON or YAML."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from remediator.cli import options, output
from remediator.domain import fleet
from remediator.domain.audit import EVENT_FILTERS as _AUDIT_FILTERS
from remediator.domain.runs import RunStatus

DEFAULT_SERVER = "http://127.0.0.1:8080"
OUTPUT_HELP = (
    "table (aligned columns; the default on a terminal), json (the default when the output "
    "is a pipe or a file) or yaml"
)


class ServerAddressError(ValueError):
    """``--server`` is not an address the CLI can use."""


def server_url(value: str) -> str:
    """A server address as given (``host:port`` or a URL) → an http(s) URL."""
    if "://" not in value:
        value = f"http://{value}"
    scheme = value.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise ServerAddressError(f"--server must be an http:// or https:// URL, got {value!r}")
    import httpx

    try:
        host = httpx.URL(value).host
    except httpx.InvalidURL as e:
        raise ServerAddressError(f"--server {value!r} is not a usable URL: {e}") from None
    if not host:
        raise ServerAddressError(f"--server {value!r} names no host")
    return value


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", choices=output.FORMATS, help=OUTPUT_HELP)


def emit(args: argparse.Namespace, value: Any, kind: str) -> None:
    """Print ``value`` (an answer of ``kind``) in the format asked for."""
    fmt = getattr(args, "output", None) or output.default_format(sys.stdout)
    print(output.render(value, fmt=fmt, kind=kind))


def _client(args: argparse.Namespace) -> Any:
    from remediator.cli import client

    return client.Client(server_url(args.server or DEFAULT_SERVER), args.token)


def _api_call(args: argparse.Namespace) -> int:
    api = _client(args)
    try:
        emit(args, args.call(api, args), args.kind)
    finally:
        api.close()
    return 0


def _params(pairs: list[str] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"--param takes KEY=VALUE, got {pair!r}")
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    return values


def _audit_export(args: argparse.Namespace) -> int:
    api = _client(args)
    filters = {name: getattr(args, name) for name in _AUDIT_FILTERS}
    try:
        if args.output:
            with open(args.output, "wb") as out:
                api.export(out, fmt=args.format, **filters)
        else:
            api.export(sys.stdout.buffer, fmt=args.format, **filters)
    finally:
        api.close()
    return 0


def _audit_keys(settings: Any) -> Any:
    from remediator.adapters import auditfiles
    from remediator.domain import audit

    if settings.audit_key_file is None:
        return None
    try:
        return auditfiles.load_keys(settings.audit_key_file, settings.audit_key_id)
    except audit.AuditKeyError as e:
        raise SystemExit(f"audit_key_file: {e}") from None


def _audit_verify(args: argparse.Namespace) -> int:
    from remediator.cli import client

    settings = options.load_settings(args, ("database_url", "audit_key_file", "audit_key_id"))
    anchors = args.anchors or settings.audit_anchor_file
    keys = _audit_keys(settings)
    if args.file:
        result = client.verify_export(pathlib.Path(args.file), keys)
        report: dict[str, Any] = {
            "ok": result.ok,
            "checked": result.checked,
            "firstBrokenId": result.first_broken_id,
            "reason": result.reason,
        }
    elif args.database_url or not args.server:
        from remediator.adapters.http import responses

        checked = client.verify_database(
            settings.database_url, keys=keys, anchors=pathlib.Path(anchors) if anchors else None
        )
        report = dict(responses.chain_report(asyncio.run(checked)))
    else:
        api = client.Client(server_url(args.server), args.token)
        try:
            report = api.verify()
        finally:
            api.close()
    emit(args, report, "verify")
    return 0 if report["ok"] else 1


def _server_options(
    parser: argparse.ArgumentParser, *, default: str | None = DEFAULT_SERVER
) -> None:
    parser.add_argument(
        "--server",
        default=os.environ.get("REMEDIATOR_SERVER", default),
        help=f"the server's URL or host:port (REMEDIATOR_SERVER; default {default})"
        if default
        else "ask this server (URL or host:port; REMEDIATOR_SERVER) instead of the database",
    )
    parser.add_argument(
        "--token", default=os.environ.get("REMEDIATOR_TOKEN"), help="API token (REMEDIATOR_TOKEN)"
    )


def _limit(most: int) -> Callable[[str], int]:
    """An argparse type: an integer from 1 to ``most``."""

    def limit(value: str) -> int:
        number = int(value)
        if not 1 <= number <= most:
            raise argparse.ArgumentTypeError(f"between 1 and {most}")
        return number

    return limit


def _api_command(
    parent: Any, name: str, call: Any, help: str, *, kind: str = "result"
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
    _server_options(parser)
    add_output_option(parser)
    parser.set_defaults(func=_api_call, call=call, kind=kind)
    return parser


def _add_runs(commands: Any) -> None:
    runs = commands.add_parser("runs", help="list, show, approve and reject runs").add_subparsers(
        dest="runs_command", required=True
    )
    listing = _api_command(
        runs,
        "list",
        lambda api, a: api.runs(
            status=a.status, playbook=a.playbook, node=a.node, limit=a.limit, cursor=a.cursor
        ),
        "list runs, newest first",
        kind="runs",
    )
    listing.add_argument(
        "--status", choices=[status.value for status in RunStatus], help="runs in this status"
    )
    listing.add_argument("--playbook", help="runs of this playbook")
    listing.add_argument("--node", help="runs on this node")
    listing.add_argument(
        "--limit", type=_limit(500), default=50, help="at most this many runs, newest first (1-500)"
    )
    listing.add_argument(
        "--cursor", type=int, help="the next page: runs older than this id (printed under a page)"
    )
    show = _api_command(runs, "show", lambda api, a: api.run(a.run), "one run in full", kind="run")
    show.add_argument("run", type=int, help="run id")
    for verb in ("approve", "reject"):
        decide = _api_command(
            runs,
            verb,
            lambda api, a, v=verb: api.decide(
                a.run, a.step, approve=v == "approve", comment=a.comment
            ),
            f"{verb} a waiting step",
        )
        decide.add_argument("run", type=int, help="run id")
        decide.add_argument("step", type=int, help="the waiting step's id")
        decide.add_argument("--comment", required=True, help="why (kept in the audit log)")


def _add_audit(commands: Any) -> None:
    audit = commands.add_parser("audit", help="export and verify the audit log").add_subparsers(
        dest="audit_command", required=True
    )
    export = audit.add_parser("export", help="stream audit events (JSON Lines or CSV)")
    _server_options(export)
    export.add_argument(
        "--format", choices=("jsonl", "csv"), default="jsonl", help="output format (jsonl)"
    )
    export.add_argument("--output", help="file to write (default: standard output)")
    for name in _AUDIT_FILTERS:
        export.add_argument("--" + name, help=f"only events matching this {name}")
    export.set_defaults(func=_audit_export)
    verify = audit.add_parser(
        "verify", help="verify the hash chain: --file EXPORT offline, the database, or --server"
    )
    _server_options(verify, default=None)
    add_output_option(verify)
    verify.add_argument("--file", help="a JSON Lines export to verify offline")
    verify.add_argument(
        "--anchors", help="anchor file to compare the chain with (default: audit_anchor_file)"
    )
    options.add_settings_options(verify, ("database_url", "audit_key_file", "audit_key_id"))
    verify.set_defaults(func=_audit_verify)


def add_commands(commands: Any) -> None:
    """``status``, ``runs``, ``runbook``, ``breaker`` and ``audit``."""
    status = _api_command(
        commands,
        "status",
        lambda api, a: api.fleet(a.state, limit=a.limit, cursor=a.cursor),
        "the fleet as remediator sees it: GPU nodes, budgets, the breaker, held steps",
        kind="fleet",
    )
    status.add_argument(
        "--state", choices=fleet.STATES, help="only the nodes in this state (held, draining, ...)"
    )
    status.add_argument(
        "--limit",
        type=_limit(fleet.MAX_NODES_LIMIT),
        help=f"at most this many nodes, by name (1-{fleet.MAX_NODES_LIMIT}; default: all)",
    )
    status.add_argument(
        "--cursor", help="the next page: nodes after this one (printed under a page)"
    )
    _add_runs(commands)
    runbook = commands.add_parser("runbook", help="manual runbooks").add_subparsers(
        dest="runbook_command", required=True
    )
    trigger = _api_command(
        runbook,
        "trigger",
        lambda api, a: api.trigger(a.playbook, node=a.node, params=_params(a.param)),
        "start a manual runbook",
    )
    trigger.add_argument("playbook", help="the manual runbook's name")
    trigger.add_argument("--node", help="the node it acts on (when the runbook takes one)")
    trigger.add_argument("--param", action="append", help="KEY=VALUE (JSON values allowed)")

    breaker = commands.add_parser("breaker", help="the circuit breaker").add_subparsers(
        dest="breaker_command", required=True
    )
    _api_command(breaker, "status", lambda api, a: api.breaker(), "breaker state", kind="breaker")
    reset = _api_command(
        breaker,
        "reset",
        lambda api, a: api.reset_breaker(a.comment),
        "close the breaker",
        kind="breaker",
    )
    reset.add_argument("--comment", required=True, help="why (kept in the audit log)")
    _add_audit(commands)
