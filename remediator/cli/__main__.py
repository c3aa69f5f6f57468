from __future__ import annotations

import sys

from remediator import cli

sys.exit(cli.main())
