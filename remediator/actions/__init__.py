"""Built-in actions. ``builtin_registry()`` is what the composition root starts from."""

from __future__ import annotations

from typing import Any

from remediator.actions import (
    basic,
    diagnose,
    driver,
    health,
    kube,
    ladder,
    reboot,
    recovery,
    remap,
    replacement,
    reset,
    smoke,
)
from remediator.ports import actions as ports_actions


def builtin_registry() -> ports_actions.Registry:
    registry = ports_actions.Registry()
    ladder_actions: list[ports_actions.Action[Any]] = [
        ladder.LadderAction(),
        reset.ResetAction(),
        reboot.RebootAction(),
        replacement.MarkForReplacementAction(),
        remap.RowRemapStatusAction(),
        recovery.RecoveryAction(),
        smoke.CudaSmokeTestAction(),
    ]
    upgrade_actions: list[ports_actions.Action[Any]] = [
        driver.UpgradeDriverAction(),
        driver.DriverRolloutAction(),
    ]
    for action in [
        *basic.ACTIONS,
        *kube.KUBE_ACTIONS,
        *health.ACTIONS,
        *diagnose.ACTIONS,
        *ladder_actions,
        *upgrade_actions,
    ]:
        registry.register(action)
    return registry
