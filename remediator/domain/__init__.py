"""Pure domain: models and decisions. No I/O, no async, no clocks (``now`` is an argument)."""
