"""``remediator``: serve, migrate, lint, schema, sim, and the operator commands (runs,
runbook, breaker, audit) that talk to a server's API with a token."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import pathlib
import sys
from typing import Any

import pydantic

from remediator import __version__
from remediator.domain.audit import EVENT_FILTERS as _AUDIT_FILTERS
from remediator.domain.runs import RunStatus

logger = logging.getLogger("remediator")

_SERVE_OPTIONS = ("listen", "database_url", "rules", "tokens")


def _add_settings_options(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    helps = {
        "listen": "host:port to listen on (REMEDIATOR_LISTEN; default 127.0.0.1:8080)",
        "database_url": "SQLAlchemy URL (REMEDIATOR_DATABASE_URL; default "
        "sqlite+aiosqlite:///remediator.db)",
        "rules": "playbook directory (REMEDIATOR_RULES; default ./rules)",
        "tokens": "tokens file (REMEDIATOR_TOKENS)",
        "audit_key_file": "audit HMAC key file or directory (REMEDIATOR_AUDIT_KEY_FILE)",
        "audit_key_id": "the signing key's id when there are several (REMEDIATOR_AUDIT_KEY_ID)",
    }
    for name in names:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, help=helps[name])
    parser.add_argument("--config", type=pathlib.Path, help="YAML settings file")


def _settings(args: argparse.Namespace, names: tuple[str, ...]) -> Any:
    from remediator.app import settings

    overrides = {name: getattr(args, name, None) for name in names}
    try:
        return settings.load(args.config, **overrides)
    except (pydantic.ValidationError, FileNotFoundError) as e:
        raise SystemExit(f"invalid settings: {e}") from None


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    import remediator.app as app_mod
    from remediator.adapters import files
    from remediator.app import logs

    settings = _settings(args, _SERVE_OPTIONS)
    logs.configure(settings.log_level, settings.log_format)
    app_mod.check_exposure(settings)
    try:
        app = app_mod.create_app(settings)
    except files.RulesInvalid as e:
        print(f"playbooks are invalid:\n{e}", file=sys.stderr)
        return 2
    except files.TokensInvalid as e:
        print(f"the tokens file is invalid:\n{e}", file=sys.stderr)
        return 2
    host, port = settings.host_port
    # Everything built so far (imported modules, the Kubernetes client's model classes, the
    # app) lives for the whole process: move it out of the collector's way, so a full
    # collection does not pause the webhook for ~100 ms while it walks 160,000 objects.
    gc.collect()
    gc.freeze()
    logger.info("listening on %s:%s", host, port, extra={"database": settings.is_sqlite})
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    logger.info("web console: http://%s:%s/", shown, port)
    web.run_app(
        app,
        host=host,
        port=port,
        print=None,
        access_log=None,
        shutdown_timeout=settings.shutdown_grace + 5,
    )
    return 1 if app[app_mod.FAILED] else 0


def _migrate(args: argparse.Namespace) -> int:
    from remediator.adapters.db import database, migrate

    settings = _settings(args, ("database_url",))

    async def run() -> str | None:
        db = database.Database(settings.database_url)
        try:
            if args.revision.startswith("-") or args.downgrade:
                await migrate.downgrade(db, args.revision)
            else:
                await migrate.upgrade(db, args.revision)
            return await migrate.current_revision(db)
        finally:
            await db.dispose()

    current = asyncio.run(run())
    print(f"database at revision {current}")
    return 0


def _lint(args: argparse.Namespace) -> int:
    from remediator.adapters import files
    from remediator.app import build_registry

    registry = build_registry(args.plugin or [])
    paths = [pathlib.Path(path) for path in args.paths]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        print(f"no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    loaded, problems = files.load_playbooks(paths, registry)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in {len(files.playbook_files(paths))} file(s)")
        return 1
    print(f"{len(loaded)} playbook(s) OK")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from remediator.domain import playbooks

    schema = playbooks.Playbook.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "remediator playbook"
    print(json.dumps(schema, indent=2, sort_keys=True))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from remediator.adapters import files
    from remediator.app import planner

    settings = _settings(args, ("database_url", "rules"))
    try:
        body = pathlib.Path(args.alert).read_bytes()
        result = asyncio.run(
            planner.plan_body(settings, body, use_database=planner.database_exists(settings))
        )
    except pydantic.ValidationError as e:
        print(f"{args.alert}: not an Alertmanager webhook payload:\n{e}", file=sys.stderr)
        return 2
    except files.RulesInvalid as e:
        print(f"playbooks are invalid:\n{e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"cannot read {args.alert}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, sort_keys=True))
    if not settings.kubernetes:
        print(
            "remediator plan: no `kubernetes` setting, so the plan shows no live state (which "
            "pods a drain would evict, current labels and power limits); point it at the "
            "cluster or the simulator for those",
            file=sys.stderr,
        )
    return 0


def _docs(args: argparse.Namespace) -> int:
    from remediator.app import docs

    if args.check:
        stale = docs.stale(args.out)
        for name in stale:
            print(f"{args.out / name} is stale: run `remediator docs`", file=sys.stderr)
        return 1 if stale else 0
    for name in docs.write(args.out):
        print(f"wrote {args.out / name}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from remediator.demo import command

    options = command.Options(
        keep_running=args.keep_running,
        interactive=args.interactive,
        color=args.color,
        rules=args.rules,
        data_dir=args.data_dir,
    )
    return command.run(options)


def _sim(args: argparse.Namespace) -> int:
    from remediator.sim import cli as sim_cli

    return sim_cli.run(args)


DEFAULT_SERVER = "http://127.0.0.1:8080"


def server_url(value: str) -> str:
    """A server address as given (``host:port`` or a URL) → an http(s) URL."""
    if "://" not in value:
        value = f"http://{value}"
    scheme = value.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise SystemExit(f"--server must be an http:// or https:// URL, got {value!r}")
    return value


def _client(args: argparse.Namespace) -> Any:
    from remediator.app import client

    return client.Client(server_url(args.server or DEFAULT_SERVER), args.token)


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _api_call(args: argparse.Namespace) -> int:
    api = _client(args)
    try:
        _print(args.call(api, args))
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
    from remediator.app import client

    settings = _settings(args, ("database_url", "audit_key_file", "audit_key_id"))
    anchors = args.anchors or settings.audit_anchor_file
    keys = _audit_keys(settings)
    if args.file:
        result = client.verify_export(pathlib.Path(args.file), keys)
        report = {
            "ok": result.ok,
            "checked": result.checked,
            "firstBrokenId": result.first_broken_id,
            "reason": result.reason,
        }
    elif args.database_url or not args.server:
        report = asyncio.run(
            client.verify_database(
                settings.database_url,
                keys=keys,
                anchors=pathlib.Path(anchors) if anchors else None,
            )
        ).json()
    else:
        api = client.Client(server_url(args.server), args.token)
        try:
            report = api.verify()
        finally:
            api.close()
    _print(report)
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


def _add_operator_commands(commands: Any) -> None:
    def api_command(parent: Any, name: str, call: Any, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = parent.add_parser(name, help=help)
        _server_options(parser)
        parser.set_defaults(func=_api_call, call=call)
        return parser

    runs = commands.add_parser("runs", help="list, show, approve and reject runs").add_subparsers(
        dest="runs_command", required=True
    )
    listing = api_command(
        runs,
        "list",
        lambda api, a: api.runs(status=a.status, playbook=a.playbook, node=a.node, limit=a.limit),
        "list runs",
    )
    listing.add_argument(
        "--status", choices=[status.value for status in RunStatus], help="runs in this status"
    )
    listing.add_argument("--playbook", help="runs of this playbook")
    listing.add_argument("--node", help="runs on this node")
    listing.add_argument(
        "--limit", type=_limit, default=50, help="at most this many runs, newest first (1-500)"
    )
    show = api_command(runs, "show", lambda api, a: api.run(a.run), "one run in full")
    show.add_argument("run", type=int, help="run id")
    for verb in ("approve", "reject"):
        decide = api_command(
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

    runbook = commands.add_parser("runbook", help="manual runbooks").add_subparsers(
        dest="runbook_command", required=True
    )
    trigger = api_command(
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
    api_command(breaker, "status", lambda api, a: api.breaker(), "breaker state")
    reset = api_command(
        breaker, "reset", lambda api, a: api.reset_breaker(a.comment), "close the breaker"
    )
    reset.add_argument("--comment", required=True, help="why (kept in the audit log)")

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
    verify.add_argument("--file", help="a JSON Lines export to verify offline")
    verify.add_argument(
        "--anchors", help="anchor file to compare the chain with (default: audit_anchor_file)"
    )
    _add_settings_options(verify, ("database_url", "audit_key_file", "audit_key_id"))
    verify.set_defaults(func=_audit_verify)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remediator", description="Alert remediation for Kubernetes GPU clusters."
    )
    parser.add_argument("--version", action="version", version=f"remediator {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the webhook, API and engine")
    _add_settings_options(serve, _SERVE_OPTIONS)
    serve.set_defaults(func=_serve)

    migrate = commands.add_parser("migrate", help="upgrade the database schema (Alembic)")
    _add_settings_options(migrate, ("database_url",))
    migrate.add_argument("--revision", default="head", help="target revision (default head)")
    migrate.add_argument("--downgrade", action="store_true", help="downgrade to --revision")
    migrate.set_defaults(func=_migrate)

    lint = commands.add_parser("lint", help="validate playbook files")
    lint.add_argument("paths", nargs="+", help="playbook files or directories")
    lint.add_argument("--plugin", action="append", help="module registering extra actions")
    lint.set_defaults(func=_lint)

    plan = commands.add_parser(
        "plan", help="show what remediator would do for an alert payload; changes nothing"
    )
    plan.add_argument("--alert", required=True, help="an Alertmanager webhook body (JSON file)")
    _add_settings_options(plan, ("database_url", "rules"))
    plan.set_defaults(func=_plan)

    schema = commands.add_parser("schema", help="print the playbook JSON Schema")
    schema.set_defaults(func=_schema)

    docs = commands.add_parser(
        "docs", help="write the generated reference docs (configuration, actions, schema)"
    )
    docs.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"))
    docs.add_argument("--check", action="store_true", help="fail if the files are stale")
    docs.set_defaults(func=_docs)

    sim = commands.add_parser("sim", help="run the simulated GPU cluster (Kubernetes API)")
    try:
        from remediator.sim import cli as sim_cli

        sim_cli.add_arguments(sim)
    except ImportError:  # pragma: no cover - the simulator ships with the package
        pass
    sim.set_defaults(func=_sim)

    demo = commands.add_parser(
        "demo", help="replay real GPU alerts against the simulator and a real server"
    )
    demo.add_argument("--keep-running", action="store_true", help="stay up until Ctrl-C")
    demo.add_argument(
        "--interactive", action="store_true", help="wait for you to approve the drains"
    )
    demo.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    demo.add_argument("--rules", type=pathlib.Path, help="playbook directory (default ./rules)")
    demo.add_argument("--data-dir", type=pathlib.Path, help="keep the database and artifacts here")
    demo.set_defaults(func=_demo)
    _add_operator_commands(commands)
    return parser


def _limit(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 500:
        raise argparse.ArgumentTypeError("between 1 and 500")
    return number


def _raised(error: BaseException, module: str, name: str) -> bool:
    """``error`` is ``module.name`` (looked up only if that module is loaded: a command that
    never imported it cannot have raised it)."""
    loaded = sys.modules.get(module)
    kind = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(kind, type) and isinstance(error, kind)


def main(argv: list[str] | None = None) -> int:
    """Run a command; what goes wrong outside remediator (a server that does not answer, an
    API error, a closed pipe, Ctrl-C) is one line on stderr and an exit status, never a
    traceback."""
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python from complaining
        # when it flushes standard output on exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if _raised(e, "remediator.app.client", "ApiError"):
            print(f"remediator: {e}", file=sys.stderr)
            return 1
        if _raised(e, "httpx", "TransportError"):
            where = getattr(args, "server", None) or DEFAULT_SERVER
            reason = str(e) or type(e).__name__
            print(f"remediator: cannot reach the server at {where}: {reason}", file=sys.stderr)
            return 2
        raise
    return result


if __name__ == "__main__":
    sys.exit(main())
