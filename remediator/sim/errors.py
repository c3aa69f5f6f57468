"""Kubernetes ``Status`` bodies and the exception that carries them to the HTTP layer."""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status_body(
    code: int,
    message: str,
    *,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason if reason is not None else REASONS.get(code, ""),
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    if not message:
        del body["message"]
    if not body["reason"]:
        del body["reason"]
    return body


class ApiError(Exception):
    """An API failure rendered as a ``Status`` body with the given HTTP code."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, reason=reason, details=details)
        self.headers = headers or {}


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, *, group: str = "", kind: str | None = None) -> ApiError:
    return ApiError(
        404,
        f'{qualified(resource, group)} "{name}" not found',
        details={"name": name, "group": group, "kind": kind or resource}
        if group
        else {"name": name, "kind": kind or resource},
    )


def already_exists(resource: str, name: str, *, group: str = "") -> ApiError:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return ApiError(
        409,
        f'{qualified(resource, group)} "{name}" already exists',
        reason="AlreadyExists",
        details=details,
    )


def conflict(resource: str, name: str, *, group: str = "") -> ApiError:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": the object '
        "has been modified; please apply your changes to the latest version and try again",
        reason="Conflict",
        details=details,
    )
