"""What a re-sent history costs: per-request `History.reconcile` time when the whole prefix is stored.

Every request re-sends the whole conversation, so this is the proxy's per-request tax. It should stay flat in
the number of stored sessions (lookups are by primary key) and never involve tiktoken (counts are cached):
the counter is wrapped here, and the table reports how often it ran during the timed calls.

Run by hand: `.venv/bin/python bench/history.py [--runs N] [--json PATH]` (bench/harness/report.py's format).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's `proxy` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.report import Report, add_json_option, columns
from proxy import environment, tokens
from proxy.history.store import History
from proxy.store.database import Database

LENGTHS = (10, 100, 1_000, 5_000)
STORED_SESSIONS = (1, 200)
FILLER_LENGTH = 200
"""Messages in each of the other stored sessions (enough rows that an index lookup is not a toy)."""
WORDS_PER_MESSAGE = 190
"""About 200 cl100k tokens of English-like text."""
DEFAULT_RUNS = 25
TENANT = "bench"
MODEL = "gpt-4"
ENCODING = "cl100k_base"
VOCABULARY = tuple(
    " ".join(
        (
            "the of and to in is that for it as was with be by on not he this are or his from at which but",
            "have an they you were her she there would their we him been has when who will more no if out so",
            "said what up its about into than them can only other new some could time these two may then do",
            "first any my now such like our over man me even most made after also did many before must",
            "through back years where much your way proxy session summary token budget context stream",
            "journal message chain branch compaction upstream",
        )
    ).split()
)


class CountingCounter:
    """tiktoken, counted; `filling` swaps in a constant while the other sessions are stored, to save time."""

    def __init__(self) -> None:
        self.calls = 0
        self.filling = False

    def __call__(self, message: Mapping[str, Any], encoding: str) -> int:
        if self.filling:
            return 200
        self.calls += 1
        return tokens.count_message(message, encoding)


def conversation(rng: random.Random, length: int, tag: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are assistant {tag}."}]
    for index in range(1, length):
        text = " ".join(rng.choice(VOCABULARY) for _ in range(WORDS_PER_MESSAGE))
        messages.append({"role": "user" if index % 2 else "assistant", "content": f"{tag} {index}: {text}"})
    return messages


async def timed(history: History, messages: list[dict[str, Any]]) -> float:
    resent = [dict(message) for message in messages]  # a client sends fresh objects every time
    started = time.perf_counter()
    result = await history.reconcile(TENANT, "main", resent, MODEL, ENCODING)
    elapsed = time.perf_counter() - started
    assert result.stored_before == len(messages)
    return elapsed


async def measure(directory: Path, stored_sessions: int, length: int, runs: int) -> dict[str, Any]:
    rng = random.Random(f"{stored_sessions}-{length}")
    path = directory / f"bench-{stored_sessions}-{length}.sqlite"
    db = await Database.open(path)
    counter = CountingCounter()
    history = History(db, count=counter)
    try:
        counter.filling = True
        for index in range(stored_sessions - 1):
            others = conversation(rng, FILLER_LENGTH, f"o{index}")
            await history.reconcile(TENANT, f"other-{index}", others, MODEL, ENCODING)
        counter.filling = False
        messages = conversation(rng, length, "main")
        await history.reconcile(TENANT, "main", messages, MODEL, ENCODING)
        counted_on_store = counter.calls
        # Warm: the same History answers again (its recent-path cache holds this session among the others).
        warm = [await timed(history, messages) for _ in range(runs)]
        # Cold: a new History each time (as after a restart), so every message is hashed and looked up.
        cold = [await timed(History(db, count=counter), messages) for _ in range(runs)]
        tokens_total = sum(message.tokens for message in (await history.path(TENANT, "main")) or [])
    finally:
        await db.close()
    return {
        "warm_ms": statistics.median(warm) * 1000,
        "cold_ms": statistics.median(cold) * 1000,
        "tokens_per_message": tokens_total / length,
        "counted_on_resend": counter.calls - counted_on_store,
        "messages": (stored_sessions - 1) * FILLER_LENGTH + length,
        # Measured after close, which checkpoints the WAL into the main file.
        "bytes": path.stat().st_size,
    }


async def measure_all(runs: int, report: Report) -> None:
    table = report.table(
        "reconcile",
        f"reconcile of a fully stored history, median of {runs} runs",
        columns(
            ("stored_sessions", "stored sessions"), ("length", "messages"), ("warm_ms", "warm median ms", ".2f"),
            ("cold_ms", "cold median ms", ".2f"), ("tokens_per_message", "tokens/msg", ".0f"),
            ("counted_on_resend", "counted on re-send"),
        ),
    )  # fmt: skip
    largest = (0, 0)
    with tempfile.TemporaryDirectory() as directory:
        for stored_sessions in STORED_SESSIONS:
            for length in LENGTHS:
                row = await measure(Path(directory), stored_sessions, length, runs)
                table.add(stored_sessions=stored_sessions, length=length, **row)
                largest = max(largest, (row["messages"], row["bytes"]))
    messages, size = largest
    table.columns += columns(("messages", "stored messages"), ("bytes", "DB bytes"))
    table.notes.append(
        f"DB size: {size / messages * 1000 / 1024:.0f} KiB per 1,000 messages "
        f"(file of {size / 2**20:.1f} MiB, {messages} messages)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    add_json_option(parser)
    args = parser.parse_args()
    environment.prepare()  # tiktoken's encodings from LiteLLM's bundled files, as `proxy serve` has them
    report = Report.start("history", args)
    asyncio.run(measure_all(args.runs, report))
    report.publish(args.json)


if __name__ == "__main__":
    main()
