"""What recall costs a request: `Recall.passages` timed over long ordinary-language conversations on a real store.

Each conversation (bench/harness/conversations.py: generated ones, and LoCoMo's with `--locomo PATH`) is stored
whole through `History` in a SQLite file (or, with `--postgres`, a PostgreSQL server the bench starts); then each
of its questions is asked as the latest user message of a context that shows only the most recent messages
fitting `--visible-tokens` (the rest hidden, as compaction leaves them), and the call recall makes for that
request is timed: the question's terms against the visible text, the lazy indexing of the hidden messages (the
first question of a conversation; reported apart), the ranked lookup, the threshold, the passages. Reported per
visible size: how often recall fired, how many passages it sent, p50/p95/max milliseconds per request and the mean
CPU time (the process's, all threads: on a loaded machine the wall time measures the machine), and what
it adds: the share of questions whose every evidence turn is in the visible messages, and in them or the
passages (a truncated context with recall, without the proxy's summaries: what recall alone brings back), and how
often it fired for a question whose evidence was all visible already.

The same script run from another checkout (copy it there) measures that checkout's recall: the bench only uses
`History.reconcile` and `Recall.passages`, whose signatures did not change.

Run by hand: `python bench/recall.py [--locomo PATH] [--generated N] [--visible-tokens 3000,7000]
[--questions N] [--postgres] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.clients import percentile
from bench.harness.conversations import Conversation, generate, load_locomo, turn_text
from bench.harness.report import Report, add_json_option, columns
from proxy.compaction.recall import Recall
from proxy.environment import prepare
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import content_text, count_message

MODEL = "gpt-4o"
ENCODING = "o200k_base"
RECALL_TOKENS = 1024
SYSTEM = {"role": "system", "content": "You are a friendly chat companion."}


@dataclass(frozen=True)
class Timed:
    milliseconds: float
    cpu_milliseconds: float
    """The process's CPU time over the call (its threads' too: SQLite's, the offloaded work): on a loaded machine
    the wall time measures the machine, this measures recall."""
    passages: int
    first: bool
    """The conversation's first question: its call also indexed the hidden messages."""
    shown: bool | None
    """Every evidence turn of the question is in the visible messages; None: it names none the chat has."""
    recalled: bool | None
    """Every evidence turn is in the visible messages or the passages."""


def recent(messages: Sequence[dict[str, Any]], tokens: int) -> int:
    """Where the most recent messages that fit `tokens` begin."""
    start, used = len(messages), 0
    while start > 0 and used + count_message(messages[start - 1], ENCODING) <= tokens:
        start -= 1
        used += count_message(messages[start], ENCODING)
    return start


async def measure(db: Database, conversation: Conversation, visible_tokens: int, questions: int | None) -> list[Timed]:
    history, recall = History(db), Recall(db)
    chat = [SYSTEM, *conversation.messages()]
    start = max(1, recent(chat, visible_tokens))
    session = f"{conversation.name}-{visible_tokens}"
    turns = {turn.id: turn_text(turn) for _, turn in conversation.turns()}
    timed: list[Timed] = []
    for index, question in enumerate(conversation.questions[:questions]):
        asked = {"role": "user", "content": question.text}
        path = (await history.reconcile("bench", session, [*chat, asked], MODEL, ENCODING)).path
        shown = {0, *range(start, len(path))}
        visible = "\n".join(content_text(message.get("content")) for message in [SYSTEM, *chat[start:]])
        began, cpu = time.perf_counter(), time.process_time()
        passages = await recall.passages("bench", session, path, shown, visible, question.text, RECALL_TOKENS, ENCODING)
        milliseconds, cpu_milliseconds = (time.perf_counter() - began) * 1000, (time.process_time() - cpu) * 1000
        evidence = [turns[id_] for id_ in question.evidence if id_ in turns]
        recalled = visible + "\n".join(passage.text for passage in passages)
        shown = all(turn in visible for turn in evidence) if evidence else None
        found = all(turn in recalled for turn in evidence) if evidence else None
        timed.append(Timed(milliseconds, cpu_milliseconds, len(passages), index == 0, shown, found))
    return timed


async def run(
    target: Path | str, sets: Sequence[Conversation], sizes: Sequence[int], questions: int | None
) -> dict[int, list[Timed]]:
    db = await Database.open(target)
    try:
        return {size: [t for c in sets for t in await measure(db, c, size, questions)] for size in sizes}
    finally:
        await db.close()


METRICS = columns(
    ("visible", "visible tokens"),
    ("questions",),
    ("fired", "recalled something", ".1%"),
    ("passages", "passages when fired", ".1f"),
    ("p50", "p50 ms", ".2f"),
    ("p95", "p95 ms", ".2f"),
    ("max", "max ms", ".1f"),
    ("cpu", "mean CPU ms", ".2f"),
    ("first", "first question ms (indexes)", ".1f"),
    ("needless", "fired, evidence visible", ".1%"),
    ("shown", "evidence: visible", ".1%"),
    ("recalled", "visible + recall", ".1%"),
)


def share(values: Sequence[bool | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--locomo", type=Path, help="LoCoMo's locomo10.json or a folder of its conversation files")
    parser.add_argument("--generated", type=int, default=4, help="generated conversations (seeds 0..N-1)")
    parser.add_argument("--visible-tokens", default="3000,7000", help="what the context shows, comma-separated")
    parser.add_argument("--questions", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--postgres", action="store_true", help="on a PostgreSQL server the bench starts")
    add_json_option(parser)
    args = parser.parse_args()
    prepare()
    sets = [generate(seed) for seed in range(args.generated)]
    if args.locomo is not None:
        sets += load_locomo(args.locomo)
    sizes = [int(size) for size in args.visible_tokens.split(",")]
    report = Report.start("recall", args)
    with ExitStack() as stack:
        if args.postgres:
            from tests.support.postgres_server import PostgresServer

            target: Path | str = stack.enter_context(PostgresServer()).database()
        else:
            target = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "store.sqlite"
        results = asyncio.run(run(target, sets, sizes, args.questions))
    engine = "postgresql" if args.postgres else "sqlite"
    table = report.table("recall", f"Recall.passages per request, {len(sets)} conversations, {engine}", METRICS)
    for size, timed in results.items():
        steady = [t.milliseconds for t in timed if not t.first]
        fired = [t for t in timed if t.passages]
        table.add(
            visible=size,
            questions=len(timed),
            fired=len(fired) / len(timed) if timed else None,
            passages=statistics.mean(t.passages for t in fired) if fired else None,
            p50=percentile(steady, 50) if steady else None,
            p95=percentile(steady, 95) if steady else None,
            max=max(steady, default=None),
            cpu=statistics.mean(t.cpu_milliseconds for t in timed if not t.first) if steady else None,
            first=statistics.mean(t.milliseconds for t in timed if t.first) if timed else None,
            needless=share([bool(t.passages) for t in timed if t.shown]),
            shown=share([t.shown for t in timed]),
            recalled=share([t.recalled for t in timed]),
        )
    report.publish(args.json)


if __name__ == "__main__":
    main()
