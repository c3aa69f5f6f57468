"""What the store records about the fleet, read for the fleet view (``domain.fleet``).

Implemented by ``adapters.db.fleet`` over SQLite and Postgres; a read, nothing is locked."""

from __future__ import annotations

from typing import Protocol

from remediator.domain import fleet


class FleetRecords(Protocol):
    async def fleet_records(self) -> fleet.Records:
        """Active runs with a node, disruptions not yet released, held steps, power caps in
        place and the breaker."""
        ...
