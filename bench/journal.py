"""What the stream journal costs at the storage layer: chunks/s relayed with it and without it.

A stream of N small chunks goes through `Journal.begin` → `append` per batch → `seal`, and each batch is then
encoded as SSE bytes (what the relay does after the commit); "journal off" is the SSE encoding alone. A batch
is the group of chunks that arrived while the previous commit was in flight: 1 is a slow upstream (one commit
per chunk, the worst case), larger batches a fast one. `synchronous` is SQLite's: NORMAL commits to the WAL
without fsync (durable against a process kill, not a power cut), FULL fsyncs every commit.

Run by hand: `.venv/bin/python bench/journal.py [--chunks N] [--dir DIR]`. The served end-to-end relay
benchmark imports `journal_cost` and `relay_cost` from here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's `proxy` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.config import JournalConfig
from proxy.database import Database
from proxy.history import History
from proxy.journal import Journal

Chunk = dict[str, Any]

DEFAULT_CHUNKS = 2_000
BATCHES = (1, 8, 64)
MODES = ("NORMAL", "FULL")
TENANT = "bench"
MODEL = "gpt-4"


def small_chunks(count: int) -> list[Chunk]:
    """OpenAI-shaped chunks of a token or two each, ending with a finish_reason."""
    chunks: list[Chunk] = [
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": f" word{n}"}, "finish_reason": None}],
        }
        for n in range(count)
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    return chunks


def _sse(batch: list[Chunk]) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in batch)


def _batches(chunks: list[Chunk], batch: int) -> list[list[Chunk]]:
    return [chunks[start : start + batch] for start in range(0, len(chunks), batch)]


async def relay_cost(chunks: list[Chunk], batch: int) -> float:
    """Chunks/s with the journal off: the SSE encoding the relay does anyway."""
    groups = _batches(chunks, batch)
    started = time.perf_counter()
    for group in groups:
        _sse(group)
        await asyncio.sleep(0)  # the relay hands each group to the response task
    return len(chunks) / (time.perf_counter() - started)


async def journal_cost(db_path: Path, synchronous: str, chunks: list[Chunk], batch: int) -> float:
    """Chunks/s through begin → append per batch → seal → SSE encoding, on a fresh store at `db_path`."""
    db = await Database.open(db_path, synchronous)
    try:
        journal = Journal(db, History(db), JournalConfig(synchronous=synchronous))
        groups = _batches(chunks, batch)
        started = time.perf_counter()
        step = await journal.begin(
            tenant=TENANT,
            session_id=None,
            model=MODEL,
            fingerprint="bench",
            idempotency_key=None,
            stream=True,
            parent_message_id=None,
            encoding="cl100k_base",
        )
        for group in groups:
            await journal.append(step, group)
            _sse(group)
        await journal.seal(step)
        return len(chunks) / (time.perf_counter() - started)
    finally:
        await db.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS)
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go (default: a temp dir)")
    args = parser.parse_args()
    chunks = small_chunks(args.chunks)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        print(f"{args.chunks} chunks; chunks/s (ratio to journal off)")
        print(f"{'batch':>6} {'journal off':>12} " + " ".join(f"{mode:>20}" for mode in MODES))
        for batch in BATCHES:
            off = max([await relay_cost(chunks, batch) for _ in range(3)])
            cells = []
            for mode in MODES:
                on = await journal_cost(Path(folder) / f"{mode}-{batch}.sqlite", mode, chunks, batch)
                cells.append(f"{on:>11,.0f} ({on / off:6.1%})")
            print(f"{batch:>6} {off:>12,.0f} " + " ".join(f"{cell:>20}" for cell in cells))


if __name__ == "__main__":
    asyncio.run(main())
