"""What planning one request costs as an agent's session grows: `Compactor.prepare` on stored sessions.

An agent's turn is four messages (its goal, a tool call, the tool's output, the answer); a session of N messages
has N/4 turns and, as a long session has once compaction has run at many crossings, one tool-output mask per
turn (each from the path's start to that turn) and one summary per turn for all but its last `RECENT_TURNS`
turns. The budget is set so that the session needs those spans and no new one: each `prepare` is what a
request between two crossings costs (read the spans, lay out the context, render it). Sessions live in a real
SQLite file; the first `prepare` (which computes every stub once) is not timed.

Run by hand: `python bench/planning.py [--sizes 1000,4000,16000] [--runs 5] [--json PATH]`. The table shows
the time per request and per 1,000 messages: planning is linear when the second stays flat.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's `proxy` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.report import Report, add_json_option, columns
from proxy import environment
from proxy.compaction.compactor import CompactionRequest, Compactor
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer import Summarizer, WrittenSummary
from proxy.config.models import ModelEntry
from proxy.config.schema import SUMMARIZE, TOOL_RESULTS, ContextConfig
from proxy.history.messages import StoredMessage, StoredPath
from proxy.history.store import History
from proxy.store.database import Database

DEFAULT_SIZES = "1000,4000,16000"
DEFAULT_RUNS = 5
RECENT_TURNS = 8
TENANT = "bench"
MODEL = "gpt-4"
ENCODING = "cl100k_base"
ENTRY = ModelEntry(name="agent", model="openai/bench-model")
OUTPUT_WORDS = 300
"""A tool output of about 300 tokens (a short file or a command's output)."""


class NoSummarizer(Summarizer):
    """The bench's spans are all written beforehand: a call here means the budget was set wrong."""

    def __init__(self) -> None:
        self.calls = 0

    def input_capacity(self, request_entry: ModelEntry) -> int:
        return 10_000_000

    async def summarize(self, messages: Any, target: int, request_entry: ModelEntry, instruction: Any = None) -> Any:
        self.calls += 1
        return WrittenSummary("unexpected summary", "llm", "bench")


def agent_session(messages: int) -> list[dict[str, Any]]:
    session: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " * 40}]
    for turn in range(messages // 4):
        call = f"call_{turn}"
        arguments = f'{{"path": "src/module_{turn}.py"}}'
        session += [
            {"role": "user", "content": f"Step {turn}: read src/module_{turn}.py and tell me what it does."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call, "type": "function", "function": {"name": "read", "arguments": arguments}}],
            },
            {"role": "tool", "tool_call_id": call, "content": f"line {turn} of the module " * (OUTPUT_WORDS // 5)},
            {"role": "assistant", "content": f"Module {turn} defines a parser for step {turn}."},
        ]
    return session


async def stored_session(db: Database, messages: list[dict[str, Any]], spans: SpanStore) -> list[StoredMessage]:
    """The session stored, with a mask per turn and a summary per turn but the last `RECENT_TURNS`."""
    path = (await History(db).reconcile(TENANT, "planning", messages, MODEL, ENCODING)).path
    turns = (len(path) - 1) // 4
    for turn in range(turns):
        end = path[4 * turn + 4]
        await spans.add(
            TENANT, start_depth=0, end=end, content="", tokens=0, original_tokens=0, model="", generated_by="llm",
            strategy=TOOL_RESULTS,
        )  # fmt: skip
        if turn < turns - RECENT_TURNS:
            await spans.add(
                TENANT, start_depth=path[4 * turn + 1].depth, end=end, content=f"Turn {turn}: module {turn} read.",
                tokens=20, original_tokens=sum(m.tokens for m in path[4 * turn + 1 : 4 * turn + 5]), model="bench",
                generated_by="llm", strategy=SUMMARIZE,
            )  # fmt: skip
    return path


async def measure(size: int, runs: int, directory: Path) -> dict[str, Any]:
    db = await Database.open(directory / f"planning-{size}.db")
    try:
        spans = SpanStore(db)
        messages = agent_session(size)
        path = await stored_session(db, messages, spans)
        summarizer = NoSummarizer()
        compactor = Compactor(ContextConfig(precompact_ratio=None), spans, summarizer)
        budget = 20 * len(path) + 40_000
        request = CompactionRequest(TENANT, "planning", messages, StoredPath(path), ENTRY, ENCODING, budget, 4)
        first = await compactor.prepare(request)
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            prepared = await compactor.prepare(request)
            seconds.append(time.perf_counter() - started)
        if prepared.tokens > budget or summarizer.calls:
            raise SystemExit("the bench's spans should suffice: the budget is set wrong")
        spans_stored = len(await spans.on_path(TENANT, path))
        ms = statistics.median(seconds) * 1000
        return {
            "messages": len(path),
            "spans": spans_stored,
            "sent": len(first.messages),
            "ms": ms,
            "ms_per_1k": ms / len(path) * 1000,
        }
    finally:
        await db.close()


async def run(sizes: list[int], runs: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-planning-") as directory:
        return [await measure(size, runs, Path(directory)) for size in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="session lengths in messages, comma-separated")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed requests per size (median shown)")
    add_json_option(parser)
    args = parser.parse_args()
    environment.prepare()
    report = Report.start("planning", args)
    table = report.table(
        "prepare",
        "Compactor.prepare per request, a mask and a summary per turn (median)",
        columns(
            ("messages", "messages"),
            ("spans", "spans"),
            ("sent", "messages sent"),
            ("ms", "ms per request", ".1f"),
            ("ms_per_1k", "ms per 1k messages", ".2f"),
        ),
    )
    rows = asyncio.run(run([int(size) for size in args.sizes.split(",")], args.runs))
    for row in rows:
        table.add(**row)
    first, last = rows[0], rows[-1]
    growth = (last["ms"] / first["ms"]) / (last["messages"] / first["messages"])
    report.ratios[f"time growth / message growth, {first['messages']} → {last['messages']}"] = round(growth, 2)
    report.publish(args.json)


if __name__ == "__main__":
    main()
