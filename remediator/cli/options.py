"""Options several commands share: settings overrides and where the settings come from."""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import pydantic


def add_settings_options(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
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


def load_settings(args: argparse.Namespace, names: tuple[str, ...]) -> Any:
    from remediator.app import settings

    overrides = {name: getattr(args, name, None) for name in names}
    try:
        return settings.load(args.config, **overrides)
    except (pydantic.ValidationError, FileNotFoundError) as e:
        raise SystemExit(f"invalid settings: {e}") from None
