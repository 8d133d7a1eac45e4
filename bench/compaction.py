"""What compaction costs and keeps over a long session: a scripted 300-turn chat on a 4k model.

The proxy is served in-process over the fake upstream (tests/support/fake_upstream.py), driven by the OpenAI SDK the
way tests/support/scripted_session.py does it. Two runs: a summarizer that keeps every planted fact, and a summarizer
that cannot be reached (the extractive fallback writes every summary). Facts are planted every 25 turns; what
is "retained" is a fact still present in the last request the model received. Latency is the client's time
for a turn minus the time of the same request sent straight to the fake, split by whether the turn compacted.

Run by hand: `.venv/bin/python bench/compaction.py [--turns N]`.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer, free_port, make_config
from tests.support.scripted_session import FACT_PATTERN, ScriptedSession, TurnRecord, install_responder, prefix_breaks

DEFAULT_TURNS = 300
WINDOW = 4096
MAX_OUTPUT = 512
FACT_EVERY = 25
COMPACTION_LOG = "proxy.compaction.compactor"


class CompactionCounter(logging.Handler):
    """Counts the compactor's one log line per summary written (also when the summarizer fell back)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("compaction "):
            self.count += 1


@dataclass(frozen=True)
class RunResult:
    name: str
    turns: list[TurnRecord]
    summaries_written: list[int]
    """Per turn: summaries the compactor wrote during it."""
    added_ms: list[float]
    """Per turn: client time minus the direct upstream time of the same request."""
    budget: int
    facts_planted: int
    facts_retained: int
    summarizer_calls: int
    """Summarizer requests that reached the fake upstream."""
    seconds: float


def planted_facts(turns: int) -> dict[int, str]:
    facts = {
        3: "Remember: the deploy key is FACT-AZURE-7731.",
        5: "Remember: the database is at FACT-db.internal:5432.",
    }
    for number in range(FACT_EVERY, turns - 5, FACT_EVERY):
        facts[number] = f"Remember: the release tag for milestone {number} is FACT-REL-{number * 37}."
    return facts


def model_entries(url: str, summarizer_base: str) -> list[dict[str, Any]]:
    common = {"model": "openai/fake-model", "api_key": "sk-x", "context_window": WINDOW, "max_output": MAX_OUTPUT}
    return [
        {"name": "small", "api_base": url, **common},
        {"name": "summarizer", "api_base": summarizer_base, **common, "model": "openai/fake-summarizer"},
    ]


def direct_ms(direct: openai.OpenAI, messages: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    direct.chat.completions.create(model="fake-model", messages=cast("list[ChatCompletionMessageParam]", messages))
    return (time.perf_counter() - started) * 1000


def run(name: str, turns: int, broken_summarizer: bool) -> RunResult:
    counter = CompactionCounter()
    logger = logging.getLogger(COMPACTION_LOG)
    logger.addHandler(counter)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    facts = planted_facts(turns)
    try:
        with FakeUpstream(context_window=WINDOW) as fake, tempfile.TemporaryDirectory() as tmp:
            install_responder(fake)
            summarizer_base = f"http://127.0.0.1:{free_port()}/v1" if broken_summarizer else fake.url
            config = make_config(
                Path(tmp),
                fake.url,
                models=model_entries(fake.url, summarizer_base),
                context={"summarizer_model": "summarizer"},
            )
            with ProxyServer(config, Path(tmp)) as proxy:
                client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=60)
                direct = openai.OpenAI(base_url=fake.url, api_key="unused", max_retries=0, timeout=60)
                session = ScriptedSession(client, fake, "bench-" + name.replace(" ", "-"), stream_every=10, facts=facts)
                session.turn()  # LiteLLM's lazy imports: not part of any turn's cost
                session.turns.clear()
                written: list[int] = []
                added: list[float] = []
                started = time.perf_counter()
                for _ in range(turns):
                    before = counter.count
                    turn = session.turn()
                    written.append(counter.count - before)
                    added.append(turn.seconds * 1000 - direct_ms(direct, turn.chat_requests[-1]))
                seconds = time.perf_counter() - started
                last = " ".join(str(m.get("content")) for m in session.turns[-1].chat_requests[-1])
                planted = {token for sentence in facts.values() for token in FACT_PATTERN.findall(sentence)}
                budget = int(session.turns[-1].headers["x-context-budget"])
                summarizer_calls = sum(turn.summarizer_requests for turn in session.turns)
                return RunResult(
                    name=name,
                    turns=session.turns,
                    summaries_written=written,
                    added_ms=added,
                    budget=budget,
                    facts_planted=len(planted),
                    facts_retained=sum(token in last for token in planted),
                    summarizer_calls=summarizer_calls,
                    seconds=seconds,
                )
    finally:
        logger.removeHandler(counter)
        logger.propagate = True


def median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def rows(result: RunResult) -> list[tuple[str, str]]:
    turns = result.turns
    requests = sum(len(turn.chat_requests) for turn in turns)
    breaks = len(prefix_breaks(turns))
    compaction_turns = [i for i, n in enumerate(result.summaries_written) if n]
    sent = [int(turn.headers["x-context-tokens"]) for turn in turns]
    normal = [ms for i, ms in enumerate(result.added_ms) if i not in compaction_turns]
    compacting = [result.added_ms[i] for i in compaction_turns]
    return [
        ("turns", str(len(turns))),
        ("summarizer calls reaching the upstream", str(result.summarizer_calls)),
        ("summaries written (compactor log)", str(sum(result.summaries_written))),
        ("compaction turns", f"{len(compaction_turns)} ({100 * len(compaction_turns) / len(turns):.1f}%)"),
        (
            "prefix-stable requests",
            f"{requests - 1 - breaks}/{requests - 1} ({100 * (1 - breaks / (requests - 1)):.1f}%)",
        ),
        ("tokens sent: max / budget", f"{max(sent)} / {result.budget} ({100 * max(sent) / result.budget:.0f}%)"),
        (
            "tokens sent: mean / budget",
            f"{statistics.mean(sent):.0f} / {result.budget} ({100 * statistics.mean(sent) / result.budget:.0f}%)",
        ),
        ("history at the end (tokens)", turns[-1].headers["x-context-history-tokens"]),
        ("facts retained at the last turn", f"{result.facts_retained}/{result.facts_planted}"),
        ("added ms, normal turn (median)", median(normal)),
        ("added ms, compaction turn (median)", median(compacting)),
        ("wall time (s)", f"{result.seconds:.1f}"),
    ]


def table(results: Sequence[RunResult]) -> str:
    header = ("metric", *(result.name for result in results))
    columns = [rows(result) for result in results]
    lines = [header] + [
        (label, *(column[index][1] for column in columns)) for index, (label, _) in enumerate(columns[0])
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) + " |" for line in lines
    ]
    rendered.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(rendered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # One fallback warning per summary otherwise.
    logging.getLogger("proxy.compaction.summarizer").setLevel(logging.ERROR)
    results = [
        run("fact-keeping summarizer", args.turns, broken_summarizer=False),
        run("extractive fallback", args.turns, broken_summarizer=True),
    ]
    print(f"Compaction over {args.turns} turns, {WINDOW}-token window, {MAX_OUTPUT} reserved output")
    print(table(results))


if __name__ == "__main__":
    main()
