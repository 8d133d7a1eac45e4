"""Agent clients installed as they ship, from their registries, into the user's cache directory (once).

An npm client goes to `<cache>/context-infinity/npm/<package>@<version>` (`npm install --prefix`); a Python one to
a venv of its own (`<cache>/context-infinity/<name>-venv`), as tests/e2e/test_agents_sdk_e2e.py does for the
Agents SDK, whose openai 3.x cannot share the project's environment (LiteLLM pins openai < 3).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

INSTALL_TIMEOUT_S = 900


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "context-infinity"


def npm_bin(package: str, version: str, command: str) -> Path:
    """The path of `command` from npm's `package@version`, installed first if it is not yet."""
    prefix = cache_dir() / "npm" / f"{package.replace('/', '+')}@{version}"
    found = prefix / "node_modules" / ".bin" / command
    if not found.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        argv = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"{package}@{version}"]
        subprocess.run(argv, check=True, timeout=INSTALL_TIMEOUT_S, capture_output=True)
    return found


def venv_python(name: str, requirement: str, module: str) -> Path:
    """The interpreter of a venv holding `requirement` (pip), made first if it cannot import `module`."""
    venv = cache_dir() / f"{name}-venv"
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
    subprocess.run([python, "-m", "pip", "install", "--quiet", requirement], check=True, timeout=INSTALL_TIMEOUT_S)
    return python
