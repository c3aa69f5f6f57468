"""The root exception and the error classes every layer shares.

Adapters translate library errors into these (chained with ``from``); the HTTP layer maps
them to JSON error bodies; the engine classifies step failures as temporary or permanent.
"""

from __future__ import annotations


class RemediatorError(Exception):
    """Root of every error remediator raises on purpose."""

    code = "error"


class ValidationFailed(RemediatorError):
    """Input that can never be valid; carries field-level details."""

    code = "invalid"

    def __init__(self, message: str, fields: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or []


class NotFound(RemediatorError):
    code = "not_found"


class Conflict(RemediatorError):
    """A guarded transition found the row in another state (compare-and-set lost)."""

    code = "conflict"


class Forbidden(RemediatorError):
    code = "forbidden"


class StoreUnavailable(RemediatorError):
    """The database cannot accept writes right now; callers should retry later."""

    code = "unavailable"


class PlaybookError(ValidationFailed):
    code = "invalid_playbook"


class ActionFailed(RemediatorError):
    """A step's action failed. ``temporary`` failures are retried by the engine."""

    code = "action_failed"

    def __init__(
        self,
        message: str,
        *,
        temporary: bool = False,
        retry_after: float | None = None,
        output: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.temporary = temporary
        self.retry_after = retry_after
        self.output = output or {}
