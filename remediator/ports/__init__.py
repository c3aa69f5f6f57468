"""Interfaces (typing.Protocol / ABC) between the engine, the actions and the adapters."""
