"""An in-memory store: the engine's unit of work without a database, for fast engine tests.

It implements ``ports.store`` with the semantics of ``adapters.db.store``: the same queries, the
same compare-and-set transitions and audit events, the same unique keys. One contract suite
(``tests/contract``) runs against it and both SQL backends.
"""
