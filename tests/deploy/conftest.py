from __future__ import annotations

import socket
from typing import Any

import pytest

from . import tools


@pytest.fixture(scope="module", params=tools.OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    """(overlay name, its objects as `kubectl kustomize` renders them)."""
    name: str = request.param
    return name, list(tools.render_overlay(name))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
