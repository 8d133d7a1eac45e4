"""`python -m proxy serve --config FILE` works like the `context-proxy` console script."""

from __future__ import annotations

import sys

from proxy.cli import main

sys.exit(main())
