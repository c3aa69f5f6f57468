"""Built-in actions. ``builtin_registry()`` is what the composition root starts from."""

from __future__ import annotations

from remediator.actions import basic, health, kube
from remediator.ports import actions as ports_actions


def builtin_registry() -> ports_actions.Registry:
    registry = ports_actions.Registry()
    for action in [*basic.ACTIONS, *kube.KUBE_ACTIONS, *health.ACTIONS]:
        registry.register(action)
    return registry
