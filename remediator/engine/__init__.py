"""The engine: turns alert episodes into runs and carries runs through their steps."""
