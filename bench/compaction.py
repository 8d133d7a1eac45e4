"""What compaction costs and keeps over a long session: a scripted 300-turn chat on a 4k model.

The proxy is served in-process over the fake upstream (tests/support/fake_upstream.py), driven by the OpenAI SDK the
way tests/support/scripted_session.py does it. Two runs: a summarizer that keeps every planted fact, and a summarizer
that cannot be reached (the extractive fallback writes every summary). Facts are planted every 25 turns; what
is "retained" is a fact still present in the last request the model received. Latency is the client's time
for a turn minus the time of the same request sent straight to the fake, split by whether the turn compacted.

The fake reports OpenAI-style prompt caching: the share of the model's input it served from its cache is shown.

Run by hand: `.venv/bin/python bench/compaction.py [--turns N] [--json PATH]` (bench/harness/report.py's format).
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

from bench.harness.report import Report, Table, add_json_option, columns
from tests.support.fake_upstream import FakeUpstream, Served
from tests.support.proxy_server import ProxyServer, free_port, make_config
from tests.support.scripted_session import FACT_PATTERN, ScriptedSession, TurnRecord, install_responder, prefix_breaks

DEFAULT_TURNS = 300
WINDOW = 4096
MAX_OUTPUT = 512
FACT_EVERY = 25
COMPACTION_LOG = "proxy.compaction.events"
SUMMARY_WRITTEN = "compaction event=complete "


class CompactionCounter(logging.Handler):
    """Counts the compaction events' one `complete` line per summary written (also when the summarizer fell
    back)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(SUMMARY_WRITTEN):
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
    sent_tokens: int = 0
    """The model's input over the run's turns, as the (caching) fake reported it; the summarizer's not included."""
    cached_tokens: int = 0


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
                served: list[Served] = []
                started = time.perf_counter()
                for _ in range(turns):
                    before, mark = counter.count, len(fake.served)
                    turn = session.turn()
                    served.extend(s for s in fake.served[mark:] if s.model == "fake-model")
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
                    sent_tokens=sum(s.prompt_tokens for s in served),
                    cached_tokens=sum(s.cached_tokens for s in served),
                )
    finally:
        logger.removeHandler(counter)
        logger.propagate = True


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


METRICS = columns(
    ("run",),
    ("turns",),
    ("summarizer_calls", "summarizer calls reaching the upstream"),
    ("summaries_written", "summaries written (event log)"),
    ("compaction_turns", "compaction turns"),
    ("compaction_turns_share", "compaction turns, share", ".1%"),
    ("cached_share", "model input served from the prompt cache", ".1%"),
    ("prefix_stable", "prefix-stable requests"),
    ("prefix_stable_share", "prefix-stable requests, share", ".1%"),
    ("tokens_max", "tokens sent: max"),
    ("tokens_mean", "tokens sent: mean", ".0f"),
    ("budget",),
    ("tokens_max_share", "tokens sent: max / budget", ".0%"),
    ("tokens_mean_share", "tokens sent: mean / budget", ".0%"),
    ("history_tokens", "history at the end (tokens)"),
    ("facts_retained", "facts retained at the last turn"),
    ("facts_planted", "facts planted"),
    ("added_ms_normal", "added ms, normal turn (median)", ".1f"),
    ("added_ms_compaction", "added ms, compaction turn (median)", ".1f"),
    ("wall_s", "wall time (s)", ".1f"),
)


def add_row(table: Table, result: RunResult) -> None:
    turns = result.turns
    requests = sum(len(turn.chat_requests) for turn in turns)
    breaks = len(prefix_breaks(turns))
    compaction_turns = [i for i, n in enumerate(result.summaries_written) if n]
    sent = [int(turn.headers["x-context-tokens"]) for turn in turns]
    normal = [ms for i, ms in enumerate(result.added_ms) if i not in compaction_turns]
    table.add(
        run=result.name,
        turns=len(turns),
        summarizer_calls=result.summarizer_calls,
        summaries_written=sum(result.summaries_written),
        compaction_turns=len(compaction_turns),
        compaction_turns_share=len(compaction_turns) / len(turns),
        cached_share=result.cached_tokens / result.sent_tokens if result.sent_tokens else None,
        prefix_stable=requests - 1 - breaks,
        prefix_stable_share=1 - breaks / (requests - 1),
        tokens_max=max(sent),
        tokens_mean=statistics.mean(sent),
        budget=result.budget,
        tokens_max_share=max(sent) / result.budget,
        tokens_mean_share=statistics.mean(sent) / result.budget,
        history_tokens=int(turns[-1].headers["x-context-history-tokens"]),
        facts_retained=result.facts_retained,
        facts_planted=result.facts_planted,
        added_ms_normal=median(normal),
        added_ms_compaction=median([result.added_ms[i] for i in compaction_turns]),
        wall_s=result.seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS)
    add_json_option(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # One fallback warning per summary otherwise.
    logging.getLogger("proxy.compaction.summarizer").setLevel(logging.ERROR)
    report = Report.start("compaction", args)
    table = report.table(
        "runs",
        f"Compaction over {args.turns} turns, {WINDOW}-token window, {MAX_OUTPUT} reserved output",
        METRICS,
        transposed=True,
    )
    add_row(table, run("fact-keeping summarizer", args.turns, broken_summarizer=False))
    add_row(table, run("extractive fallback", args.turns, broken_summarizer=True))
    report.publish(args.json)


if __name__ == "__main__":
    main()
