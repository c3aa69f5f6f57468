"""Self-metrics (prometheus-client), one registry per app so tests can run several apps."""

from __future__ import annotations

import prometheus_client as prom


class Metrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.deliveries = prom.Counter(
            "remediator_deliveries", "Webhook deliveries stored.", registry=r
        )
        self.deliveries_rejected = prom.Counter(
            "remediator_deliveries_rejected",
            "Webhook deliveries refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.alerts_received = prom.Counter(
            "remediator_alerts_received", "Alerts received, by status.", ["status"], registry=r
        )
        self.alerts_deduplicated = prom.Counter(
            "remediator_alerts_deduplicated",
            "Alerts that repeated a stored episode and changed nothing.",
            registry=r,
        )
        self.runs_created_total = prom.Counter(
            "remediator_runs_planned", "Runs created from alerts and triggers.", registry=r
        )
        self.runs = prom.Counter(
            "remediator_runs",
            "Runs finished, by playbook and final state.",
            ["playbook", "state"],
            registry=r,
        )
        self.step_duration = prom.Histogram(
            "remediator_step_duration_seconds",
            "Step attempt duration, by action and outcome.",
            ["action", "outcome"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
            registry=r,
        )
        self.claim_lag_seconds = prom.Histogram(
            "remediator_claim_loop_lag_seconds",
            "Delay between a step becoming due and being claimed.",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.db_latency = prom.Histogram(
            "remediator_db_latency_seconds",
            "Database transaction latency, by operation.",
            ["operation"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
            registry=r,
        )
        self.playbooks_loaded = prom.Gauge(
            "remediator_playbooks_loaded", "Playbooks currently loaded.", registry=r
        )

    # Observer protocol (engine hooks)
    def run_finished(self, playbook: str, state: str) -> None:
        self.runs.labels(playbook=playbook, state=state).inc()

    def runs_created(self, count: int) -> None:
        self.runs_created_total.inc(count)

    def step_finished(self, action: str, outcome: str, seconds: float) -> None:
        self.step_duration.labels(action=action, outcome=outcome).observe(seconds)

    def claim_lag(self, seconds: float) -> None:
        self.claim_lag_seconds.observe(max(seconds, 0.0))

    def observe_db(self, operation: str, seconds: float) -> None:
        self.db_latency.labels(operation=operation).observe(seconds)

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)
