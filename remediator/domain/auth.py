"""Identities and roles.

- ``ingest``: may only post alerts (Alertmanager's token);
- ``operator``: reads alerts and runs, approves, rejects and triggers runbooks;
- ``auditor``: reads everything, changes nothing;
- ``admin``: everything.

Tokens are kept as SHA-256 digests only; a presented token is hashed and compared against every
known digest with a constant-time comparison.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import hmac

import pydantic


class Role(enum.StrEnum):
    INGEST = "ingest"
    OPERATOR = "operator"
    AUDITOR = "auditor"
    ADMIN = "admin"


class Permission(enum.StrEnum):
    INGEST = "ingest"
    READ = "read"
    OPERATE = "operate"
    AUDIT = "audit"
    ADMIN = "admin"


ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.INGEST: frozenset({Permission.INGEST}),
    Role.OPERATOR: frozenset({Permission.READ, Permission.OPERATE}),
    Role.AUDITOR: frozenset({Permission.READ, Permission.AUDIT}),
    Role.ADMIN: frozenset(Permission),
}


@dataclasses.dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[Role]

    def can(self, permission: Permission) -> bool:
        return permission in _granted(self.roles)


@functools.cache  # a handful of role sets: those of the tokens file
def _granted(roles: frozenset[Role]) -> frozenset[Permission]:
    return frozenset().union(*(ROLE_PERMISSIONS[role] for role in roles))


ANONYMOUS_ADMIN = Principal("anonymous", frozenset({Role.ADMIN}))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenEntry(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: str = pydantic.Field(pattern=r"^[A-Za-z0-9_.@-]{1,200}$")
    token_sha256: str | None = pydantic.Field(default=None, pattern=r"^[0-9a-f]{64}$")
    token: str | None = pydantic.Field(default=None, min_length=16, repr=False)
    roles: list[Role] = pydantic.Field(min_length=1)

    @pydantic.model_validator(mode="after")
    def _one_secret(self) -> TokenEntry:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token_sha256 or token")
        return self

    @property
    def digest(self) -> str:
        return self.token_sha256 or hash_token(self.token or "")


class TokenBook:
    """Known identities, by token digest. Lookup compares against every entry in constant time."""

    def __init__(self, entries: list[TokenEntry]) -> None:
        names = [entry.name for entry in entries]
        if len(set(names)) != len(names):
            raise ValueError("token names must be unique")
        self._entries = [
            (bytes.fromhex(entry.digest), Principal(entry.name, frozenset(entry.roles)))
            for entry in entries
        ]

    def authenticate(self, token: str, *, name: str | None = None) -> Principal | None:
        presented = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, presented) and (name is None or name == principal.name):
                found = principal
        return found

    def __len__(self) -> int:
        return len(self._entries)
