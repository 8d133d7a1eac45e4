"""`proxy.serving.heap`: a growing conversation's bodies come from memory already mapped, not from pages faulted in anew
for each request. Counted in page faults (deterministic), in a child process: the setting is process-wide."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

BODIES = """
import json, resource, sys
from proxy.serving.heap import keep_large_buffers
set_up = keep_large_buffers() if sys.argv[1] == "kept" else None
kept, faults = [], []
for turn in range(20):  # a body a little bigger each turn; the last few are held, as the re-sent lists hold them
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    body = b"x" * (4_000_000 + turn * 50_000)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    kept = [*kept[-3:], body]
print(json.dumps({"set_up": set_up, "faults": sum(faults[10:])}))
"""


def bodies(mode: str) -> tuple[bool | None, int]:
    """Whether the setting took, and the page faults of the last ten bodies."""
    done = subprocess.run([sys.executable, "-c", BODIES, mode], capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(done.stdout)
    return result["set_up"], int(result["faults"])


@pytest.mark.slow
def test_a_growing_body_is_not_faulted_in_anew_every_turn() -> None:
    (set_up, kept), (_, default) = bodies("kept"), bodies("default")
    if platform.libc_ver()[0] != "glibc":
        assert set_up is False  # nothing to set: the buffers are allocated as before
        return
    assert set_up is True
    assert default > 10 * 900  # ~1,000 faults a 4 MB body by default: its pages mapped for it
    assert kept < default / 5


SERVING = """
import asyncio, gc, json, tempfile
from pathlib import Path
from proxy import tokens
from proxy.serving.app import create_app
from proxy.config.schema import parse_config

async def started(serving: bool) -> dict[str, int]:
    tokens._encoding.cache_clear()
    with tempfile.TemporaryDirectory() as folder:
        raw = {
            "store": {"path": str(Path(folder) / "store.db")},
            "models": [{"name": "m", "model": "openai/gpt-4o", "api_base": "http://127.0.0.1:9/v1", "api_key": "k"}],
        }
        app = create_app(parse_config(raw, base_dir=Path(folder), environ={}), serving=serving)
        async with app.router.lifespan_context(app):
            return {"frozen": gc.get_freeze_count(), "encodings": tokens._encoding.cache_info().currsize}

async def both() -> dict[str, dict[str, int]]:
    embedded = await started(False)  # first: serving's freeze is process-wide and stays
    return {"embedded": embedded, "serving": await started(True)}

print(json.dumps(asyncio.run(both())))
"""


@pytest.mark.slow
def test_serve_leaves_what_it_loaded_out_of_the_collectors_full_passes() -> None:
    """One child process (the freeze is process-wide) starts an embedded app, then a serving one: each from no
    encoding loaded."""
    done = subprocess.run([sys.executable, "-c", SERVING], capture_output=True, text=True, check=True, timeout=60)
    started: dict[str, dict[str, int]] = json.loads(done.stdout.splitlines()[-1])
    serving, embedded = started["serving"], started["embedded"]
    assert serving["frozen"] > 50_000  # the modules' objects and the encoding's tables
    assert embedded["frozen"] == 0  # an app in another program (a test) leaves its host's collector alone
    assert serving["encodings"] == embedded["encodings"] == 1  # gpt-4o's o200k_base, read at startup
