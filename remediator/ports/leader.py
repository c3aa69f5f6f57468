"""A named lease that at most one replica holds: the gate for singleton loops.

Implemented over the database (``adapters.leader.DatabaseLease``, table ``leader_leases``) and
over a Kubernetes ``coordination.k8s.io/v1`` Lease (``adapters.kubernetes.leases``). Both are
compare-and-set: a holder renews only its own, unexpired or not, and anyone takes an expired
one; two candidates racing for a free lease get one winner.
"""

from __future__ import annotations

from typing import Protocol


class LeaderLease(Protocol):
    @property
    def name(self) -> str: ...

    async def acquire_or_renew(self, holder: str, *, duration: float) -> bool:
        """Take or extend the lease for ``duration`` seconds from now.

        ``True``: ``holder`` holds it now. ``False``: someone else holds an unexpired lease.
        Transport failures raise (the caller cannot tell whether it still holds the lease).
        """
        ...

    async def release(self, holder: str) -> None:
        """Give the lease up at once if ``holder`` holds it (graceful shutdown)."""
        ...

    async def close(self) -> None: ...
