"""Adapters: the outside world (database, HTTP, Kubernetes, notifications, rule files)."""
