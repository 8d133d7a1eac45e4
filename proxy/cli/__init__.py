"""`context-proxy`: the commands (`commands`) and the text rendering of the inspection views (`render`).

`main` is the console script's entry point (`proxy.cli:main`).
"""

from proxy.cli.commands import main

__all__ = ["main"]
