"""remediator: event-driven alert remediation for Kubernetes GPU clusters."""

from __future__ import annotations

__version__ = "0.1.0"
