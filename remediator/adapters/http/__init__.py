"""The HTTP API (aiohttp): Alertmanager intake, runs, approvals, health and metrics."""
