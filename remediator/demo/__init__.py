"""``remediator demo``: the simulated GPU fleet, ``remediator serve`` on SQLite and ``rules/``,
and a scenario of real Alertmanager 0.25 deliveries replayed through the HTTP API.

A client of the server and the simulator only: it talks HTTP to ``remediator serve`` (a
subprocess, exactly what users run) and reads the in-process simulator's state to check that
every act ended as expected. ``acts`` holds the scenario as data, ``display`` the timeline,
``processes`` the simulator and server, ``runner`` the replay and its checks.
"""
