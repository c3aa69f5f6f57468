"""``python -m remediator.sim``: run the simulator (same options as ``remediator sim``)."""

from __future__ import annotations

import sys

from remediator.sim import cli

if __name__ == "__main__":
    sys.exit(cli.main())
