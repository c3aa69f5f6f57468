"""What an alert episode keeps once its retention ends.

Alert labels and annotations are whatever Prometheus rules attach: pod and namespace names of
users' workloads, free-text descriptions, query expressions in the generator URL. They are
needed while an episode is live (matching, targeting, templates, the runbook page) and for a
while after, for on-call and post-mortems. Past ``alert_retention_days`` after an episode
ended (resolved, the resolution handled) and once every run of it has finished, remediator
keeps only what the audit trail needs to make sense:

- the episode's own columns: fingerprint, alert name, start, end, status;
- the labels in ``KEPT_LABELS``: the alert name, its severity, and the default node and GPU
  labels that targeting reads (the run rows keep the node and GPU they acted on as well);
- nothing of the annotations or the generator URL, and no link to the raw deliveries (those
  expire after ``delivery_retention_days`` anyway).

An episode no run refers to is deleted outright. Runs, steps and the audit log are kept, and
the audit events carry their own data, so the hash chain is untouched.

Reduction happens once: a reduced episode has no delivery link and no generator URL, which
is how the next pass knows to skip it (intake always records the first delivery).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from remediator.domain import matching

KEPT_LABELS = frozenset(
    {"alertname", "severity", *matching.DEFAULT_NODE_LABELS, *matching.DEFAULT_GPU_LABELS}
)


def reduce_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels an expired episode keeps."""
    return {name: value for name, value in labels.items() if name in KEPT_LABELS}


@dataclasses.dataclass(frozen=True)
class Pruned:
    """What one retention pass did to expired episodes."""

    reduced: int = 0  # labels cut to ``KEPT_LABELS``, annotations and URL cleared
    deleted: int = 0  # no run referred to them
