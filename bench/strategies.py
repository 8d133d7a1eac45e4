"""What each compaction strategy set costs and keeps: an agent session and a chat session, side by side.

Issue 15's benchmark. Every row is one strategy set served by the proxy in-process (tests/support/proxy_server.py) over
the fake upstream (tests/support/fake_upstream.py), driven by the OpenAI SDK; the last row is a client that truncates
on its own (its oldest whole turns dropped to fit the budget the proxy reports, sent with `X-Context-Mode: off`).

What it models:
- agent (32k window): each turn a user instruction, then the fake model asks for 1-3 parallel tool calls
  (read_file, run_tests, grep); the client writes their outputs, 1-6k tokens each (files, logs, grep hits;
  most near 1-2k, a turn's outputs capped at `TURN_OUTPUT_CAP`), and the model answers. Two model calls a turn.
- chat (6k window): prose turns of 60-150 tokens, answers of 40-80.
- 15 `KEY=value` facts per session, spread over its first 85 %: in user messages (chat; half of the agent's)
  or in the middle of a tool output (the other half).
- The main model answers after `--main-latency` s; the summarizer is another `models:` entry on a second fake,
  `context.summarizer_model`, answering after `--summarizer-latency` s. It is LLM-like: it echoes every
  `KEY=value` it reads plus a gist of about two thirds of its target. A second run of each summarizing row has
  the summarizer unreachable (every summary is the extractive fallback); it only measures the facts kept, so
  its main model answers at once.
- After the session, one question per fact ("Question: what was DEPLOY_REGION set to?"), one turn each.

Columns:
- crossing: a model call whose working context would exceed the trigger without compaction, i.e. the tokens
  the previous call sent (X-Context-Tokens, or the client's own count) plus what the client appended since
  (counted like the proxy) pass `trigger_ratio` of the budget. This is the call that pays for compaction when
  nothing was done ahead of it, whichever strategy runs and whoever wrote the spans.
- x p50 / x p95: the crossing calls' p50 / p95 client latency over the p50 of every other call of the session.
- spans fg/bg: spans written on a request's path / in the background (GET /sessions/{id}/events).
- summ calls: summarizer requests that reached its fake. tokens: prompt tokens of every request both fakes
  received during the session (main + summarizer, the fake's own count), and that over the truncating client's.
- prefix-stable: share of consecutive main requests whose prompt after the system message extends the previous.
- facts: planted values present in the last request of the session, with the LLM-like summarizer / the
  fallback. recall: questions whose prompt contained the value / answers with X-Context-Recalled > 0.

Jobs (a row, a session, a summarizer) run in worker processes, `--jobs` at once: sleeps dominate, but on a
small machine the parsing of large re-sent histories competes for the CPUs, so latencies carry some noise.

Run by hand: `python bench/strategies.py [--turns N] [--only ROW ...] [--session agent|chat] [--jobs N]
[--json PATH]` (bench/harness/report.py's format). The
issue asks for 300 turns per session; the default is `DEFAULT_TURNS` (150) because 60 turns took 4.7 minutes
with 3 jobs on a 2-CPU machine and the agent's re-sent history (its parsing grows with the square of the turns)
puts 300 turns well past 25 minutes: `--turns 300` runs the issue's length.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import multiprocessing
import random
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from bench.harness.report import Report, add_json_option, columns
from proxy.tokens import DEFAULT_ENCODING, count_message, count_text
from tests.support.fake_upstream import FakeUpstream, Reply, content_text, count_prompt_tokens
from tests.support.proxy_server import HOST, ProxyServer, make_config
from tests.support.scripted_session import VOCABULARY, filler, prefix_extensions, seeded

DEFAULT_TURNS = 150
DEFAULT_MAIN_LATENCY_S = 0.3
DEFAULT_SUMMARIZER_LATENCY_S = 2.0
DEFAULT_JOBS = 3
SEED = 15
FACT_COUNT = 15
FACT_SPREAD = 0.85
"""Facts are planted over this share of the session's turns: the last ones are still recent at its end."""
SUMMARIZER_WINDOW = 32_768
MAIN_MODEL = "fake-model"
SUMMARIZER_MODEL = "fake-summarizer"
QUESTION_PREFIX = "Question: "
TOOLS = ("read_file", "run_tests", "grep")
TOOL_OUTPUT_TOKENS = (1000, 6000)
TOOL_OUTPUT_SKEW = 3.0
"""Output sizes are min + (max - min) * u**SKEW: most near 1-2k tokens, a few near 6k."""
TURN_OUTPUT_CAP = 10_000
"""A turn's tool outputs together, so that one turn always fits the agent's budget."""
FACT_KEYS = (
    "DEPLOY_REGION", "DB_PORT", "CACHE_TTL", "RELEASE_TAG", "API_TIMEOUT", "MAX_WORKERS", "FEATURE_FLAG",
    "BUILD_ID", "LOG_LEVEL", "QUEUE_NAME", "BUCKET_NAME", "RETRY_LIMIT", "ONCALL_USER", "SHARD_COUNT", "TLS_PROFILE",
)  # fmt: skip
FACT_LINE = re.compile(r"\b([A-Z][A-Z0-9_]{2,})=([^\s,;]+)")
TARGET = re.compile(r"at most about (\d+) tokens")
CALL_ID = re.compile(r"^call_([0-9a-f]{8})_(\d)of(\d)$")


@dataclass(frozen=True)
class Shape:
    """A session kind: the model it talks to and how big its turns are."""

    name: str
    window: int
    max_output: int
    system: str


SHAPES = {
    "agent": Shape("agent", 32_768, 1024, "You are a coding agent. Use the tools to inspect the repository."),
    "chat": Shape("chat", 6144, 512, "You are a helpful assistant. Answer briefly."),
}


@dataclass(frozen=True)
class Row:
    name: str
    strategies: tuple[str, ...]
    precompact: bool = True
    client_truncates: bool = False

    @property
    def summarizes(self) -> bool:
        return any(name in ("summarize", "goal-batch") for name in self.strategies)


ROWS = {
    row.name: row
    for row in (
        Row("summarize, no pre-compaction", ("summarize",), precompact=False),
        Row("summarize", ("summarize",)),
        Row("tool-results,summarize", ("tool-results", "summarize")),
        Row("goal-batch", ("goal-batch",)),
        Row("sliding-window", ("sliding-window",)),
        Row("client truncation", (), client_truncates=True),
    )
}


@dataclass(frozen=True)
class Fact:
    key: str
    value: str
    turn: int
    in_tool_output: bool

    @property
    def line(self) -> str:
        return f"{self.key}={self.value}"


@dataclass(frozen=True)
class Job:
    row: str
    shape: str
    turns: int
    main_latency: float
    summarizer_latency: float
    fallback: bool
    """The summarizer is unreachable: only the facts this run keeps are reported."""


@dataclass
class JobResult:
    job: Job
    latencies: list[float] = field(default_factory=list)
    crossings: list[bool] = field(default_factory=list)
    summarizer_calls: int = 0
    main_tokens: int = 0
    summarizer_tokens: int = 0
    prefix_stable: list[bool] = field(default_factory=list)
    facts_kept: int = 0
    recall_hits: int = 0
    recalled: int = 0
    spans_foreground: int = 0
    spans_background: int = 0
    rejected: list[str] = field(default_factory=list)
    """Requests the main fake refused (a working context over its window, a broken tool pairing)."""
    error: str | None = None
    seconds: float = 0.0


def plant(shape: Shape, turns: int) -> dict[int, Fact]:
    rng = random.Random(f"{SEED}:{shape.name}:facts")
    facts: dict[int, Fact] = {}
    for index, key in enumerate(FACT_KEYS[:FACT_COUNT]):
        turn = 1 + int((index + 0.5) * FACT_SPREAD * turns / FACT_COUNT)
        value = f"{rng.choice(VOCABULARY)}-{rng.randint(1000, 99999)}"
        facts[turn] = Fact(key, value, turn, in_tool_output=shape.name == "agent" and index % 2 == 1)
    return facts


def question(fact: Fact) -> str:
    return f"{QUESTION_PREFIX}what was {fact.key} set to?"


def answer_to_question(messages: Sequence[Mapping[str, Any]]) -> Reply:
    """What a model would say: the value if its prompt shows it, else that it does not know."""
    asked = content_text(messages[-1].get("content")).split()[-3]
    prompt = "\n".join(content_text(m.get("content")) for m in messages[:-1])
    found = re.search(rf"\b{re.escape(asked)}=([^\s,;]+)", prompt)
    return Reply(content=f"{asked} was {found.group(1)}." if found else f"I do not know what {asked} was set to.")


def main_reply(shape: Shape) -> Callable[[dict[str, Any]], Reply]:
    """The fake main model. The agent's calls carry their plan in their ids (`call_<turn>_<k>of<n>`), so it
    needs no state and no sight of the instruction, which compaction may have summarized by then."""

    def reply(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        last = messages[-1]
        text = content_text(last.get("content"))
        if last.get("role") == "user" and text.startswith(QUESTION_PREFIX):
            return answer_to_question(messages)
        rng = seeded(f"{len(messages)}:{text}")
        if shape.name == "agent" and last.get("role") == "user":
            digest = hashlib.sha256(text.encode()).hexdigest()[:8]
            count = 1 + int(digest, 16) % 3
            calls = [
                {
                    "id": f"call_{digest}_{k}of{count}",
                    "type": "function",
                    "function": {
                        "name": TOOLS[(int(digest, 16) + k) % len(TOOLS)],
                        "arguments": json.dumps({"path": f"src/pkg_{digest[k]}/module_{digest[k + 1 :][:3]}.py"}),
                    },
                }
                for k in range(1, count + 1)
            ]
            return Reply(tool_calls=calls)
        return Reply(content=filler(rng, rng.randint(32, 64)))

    return reply


def llm_like_summary(body: dict[str, Any]) -> Reply:
    """A summarizer that keeps facts the way a good model does: every KEY=value it reads, and a short gist."""
    instruction = content_text(body["messages"][0].get("content"))
    transcript = content_text(body["messages"][-1].get("content"))
    match = TARGET.search(instruction)
    target = int(match.group(1)) if match else 64
    facts = list(dict.fromkeys(f"{key}={value}" for key, value in FACT_LINE.findall(transcript)))
    rng = seeded(transcript)
    return Reply(content="Gist: " + filler(rng, max(8, target * 2 // 3)) + "".join(f"\n{line}" for line in facts))


def tool_output(call: Mapping[str, Any], tokens: int, fact: Fact | None) -> str:
    """A file, a test log or grep hits of about `tokens` tokens; a planted fact sits in the middle."""
    name = call["function"]["name"]
    path = json.loads(call["function"]["arguments"])["path"]
    rng = seeded(call["id"])
    lines: list[str] = []
    size = 0
    while size < tokens:
        number = len(lines) + 1
        if name == "read_file":
            word = rng.choice(VOCABULARY)
            line = f"def {word}_{number}(value: int) -> int:\n    return value * {rng.randint(2, 97)}  # {word}"
        elif name == "run_tests":
            line = (
                f"2025-03-0{rng.randint(1, 9)}T10:{rng.randint(10, 59)}:{rng.randint(10, 59)}Z "
                f"{rng.choice(('INFO', 'INFO', 'WARN', 'DEBUG'))} tests/test_{rng.choice(VOCABULARY)}.py::"
                f"test_{rng.choice(VOCABULARY)}_{number} {rng.choice(('PASSED', 'PASSED', 'SKIPPED'))} "
                f"({rng.randint(1, 900)} ms)"
            )
        else:
            line = f"{path}:{rng.randint(1, 2000)}: {filler(rng, rng.randint(6, 12))}"
        lines.append(line)
        if number % 16 == 0:
            size = count_text("\n".join(lines))
    if fact is not None:
        lines.insert(len(lines) // 2, fact.line)
    return "\n".join(lines)


def output_sizes(call_ids: Sequence[str]) -> list[int]:
    low, high = TOOL_OUTPUT_TOKENS
    sizes = [low + int((high - low) * seeded(f"size:{cid}").random() ** TOOL_OUTPUT_SKEW) for cid in call_ids]
    scale = min(1.0, TURN_OUTPUT_CAP / sum(sizes)) if sizes else 1.0
    return [max(low, int(size * scale)) for size in sizes]


class Client:
    """A client re-sending its whole history each call (or, truncating, its newest whole turns that fit)."""

    def __init__(self, sdk: openai.OpenAI, shape: Shape, session_id: str, truncates: bool) -> None:
        self.sdk = sdk
        self.shape = shape
        self.session_id = session_id
        self.truncates = truncates
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": shape.system}]
        self.counts: list[int] = [count_message(self.messages[0], DEFAULT_ENCODING)]
        self.budget = shape.window - shape.max_output
        """What the proxy reports (X-Context-Budget); a first guess until its first answer."""
        self.previous_tokens = 0
        self.sent_upto = 0
        self.latencies: list[float] = []
        self.crossings: list[bool] = []
        self.recalled: list[int] = []

    def append(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.counts.append(count_message(message, DEFAULT_ENCODING))

    def call(self, trigger_ratio: float = 1.0) -> dict[str, Any]:
        """One model call: the assistant message it answered, appended to the history."""
        would = self.previous_tokens + sum(self.counts[self.sent_upto :]) + (3 if not self.sent_upto else 0)
        messages, sent_tokens = self._to_send()
        extra = {"X-Session-Id": self.session_id}
        if self.truncates:
            extra["X-Context-Mode"] = "off"
        started = time.perf_counter()
        raw = self.sdk.chat.completions.with_raw_response.create(
            model=self.shape.name, messages=cast("list[ChatCompletionMessageParam]", messages), extra_headers=extra
        )
        self.latencies.append(time.perf_counter() - started)
        self.crossings.append(would > trigger_ratio * self.budget)
        headers = raw.headers
        self.budget = int(headers.get("x-context-budget", self.budget))
        self.previous_tokens = int(headers.get("x-context-tokens", sent_tokens))
        self.recalled.append(int(headers.get("x-context-recalled", "0")))
        self.sent_upto = len(self.messages)
        message = raw.parse().choices[0].message
        answer: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            answer["tool_calls"] = [call.model_dump(include={"id", "type", "function"}) for call in message.tool_calls]
        self.append(answer)
        return answer

    def _to_send(self) -> tuple[list[dict[str, Any]], int]:
        total = 3 + sum(self.counts)
        if not self.truncates or total <= self.budget:
            return self.messages, total
        start = 1
        while total > self.budget and start < len(self.messages) - 1:
            total -= self.counts[start]
            start += 1
            while start < len(self.messages) - 1 and self.messages[start]["role"] != "user":
                total -= self.counts[start]
                start += 1
        return [self.messages[0], *self.messages[start:]], total


def user_text(shape: Shape, rng: random.Random, number: int, fact: Fact | None) -> str:
    words = rng.randint(16, 48) if shape.name == "agent" else rng.randint(48, 120)
    text = (f"Task {number}: " if shape.name == "agent" else "") + filler(rng, words)
    if fact is not None and not fact.in_tool_output:
        sentences = text.split(". ")
        sentences.insert(len(sentences) // 2, f"Note that {fact.line} from now on")
        text = ". ".join(sentences)
    return text


def play(client: Client, shape: Shape, turns: int, facts: Mapping[int, Fact]) -> None:
    rng = random.Random(f"{SEED}:{shape.name}:turns")
    for number in range(1, turns + 1):
        fact = facts.get(number)
        client.append({"role": "user", "content": user_text(shape, rng, number, fact)})
        answer = client.call()
        calls = answer.get("tool_calls") or []
        if not calls:
            continue
        sizes = output_sizes([call["id"] for call in calls])
        for index, (call, size) in enumerate(zip(calls, sizes, strict=True)):
            planted = fact if fact is not None and fact.in_tool_output and index == 0 else None
            client.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output(call, size, planted)})
        client.call()


def proxy_config(tmp: Path, job: Job, row: Row, main_url: str, summarizer_url: str) -> dict[str, Any]:
    shape = SHAPES[job.shape]
    context: dict[str, Any] = {"summarizer_model": "summarizer"}
    if row.strategies:
        context["strategies"] = list(row.strategies)
    if not row.precompact:
        context["precompact_ratio"] = "off"
    models = [
        {
            "name": shape.name,
            "model": f"openai/{MAIN_MODEL}",
            "api_base": main_url,
            "api_key": "sk-bench",
            "context_window": shape.window,
            "max_output": shape.max_output,
        },
        {
            "name": "summarizer",
            "model": f"openai/{SUMMARIZER_MODEL}",
            "api_base": summarizer_url,
            "api_key": "sk-bench",
            "context_window": SUMMARIZER_WINDOW,
            "max_output": 4096,
        },
    ]
    return make_config(tmp, main_url, models=models, context=context, upstream={"timeout_s": 120})


@contextmanager
def quiet_proxy_logs() -> Iterator[None]:
    """One warning per fallback summary otherwise (the unreachable summarizer)."""
    logger = logging.getLogger("proxy")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def span_counts(base_url: str, session_id: str) -> tuple[int, int]:
    """Spans completed on a request's path and in the background, from the session's compaction events."""
    foreground = background = offset = 0
    while True:
        page = httpx.get(f"{base_url}/sessions/{session_id}/events", params={"limit": 100, "offset": offset}).json()
        for event in page["events"]:
            if event["event"] == "complete":
                background += bool(event["background"])
                foreground += not event["background"]
        offset += len(page["events"])
        if not page.get("more") or not page["events"]:
            return foreground, background


def run_job(job: Job) -> JobResult:
    logging.basicConfig(level=logging.WARNING)
    row, shape = ROWS[job.row], SHAPES[job.shape]
    facts = plant(shape, job.turns)
    result = JobResult(job)
    main_latency = 0.0 if job.fallback else job.main_latency
    started = time.perf_counter()
    with (
        quiet_proxy_logs(),
        FakeUpstream(context_window=shape.window) as main_fake,
        FakeUpstream(context_window=SUMMARIZER_WINDOW) as summarizer_fake,
        tempfile.TemporaryDirectory() as tmp,
        socket.socket() as unreachable,
    ):
        # Bound and never listening: connections are refused, and no other job's server can take the port (a
        # port only looked up as free could be, and would then answer this job's summarizer calls).
        unreachable.bind((HOST, 0))
        main_fake.responder = main_reply(shape)
        main_fake.delay = lambda body: main_latency if body.get("model") == MAIN_MODEL else 0.0
        summarizer_fake.responder = llm_like_summary
        summarizer_fake.delay = lambda body: job.summarizer_latency if body.get("model") == SUMMARIZER_MODEL else 0.0
        summarizer_url = f"http://{HOST}:{unreachable.getsockname()[1]}/v1" if job.fallback else summarizer_fake.url
        config = proxy_config(Path(tmp), job, row, main_fake.url, summarizer_url)
        with ProxyServer(config, Path(tmp)) as proxy:
            sdk = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=300)
            session_id = f"bench-{shape.name}"
            client = Client(sdk, shape, session_id, row.client_truncates)
            try:
                play(client, shape, job.turns, facts)
                fakes = (main_fake, summarizer_fake)
                received = [request.body for fake in fakes for request in list(fake.requests)]
                main_prompts = [body["messages"] for body in received if body.get("model") == MAIN_MODEL]
                last = "\n".join(content_text(m.get("content")) for m in main_prompts[-1])
                result.facts_kept = sum(fact.line in last for fact in facts.values())
                result.latencies = list(client.latencies)
                result.crossings = list(client.crossings)
                result.prefix_stable = prefix_extensions(main_prompts)
                result.main_tokens = sum(count_prompt_tokens(prompt) for prompt in main_prompts)
                summarized = [body for body in received if body.get("model") == SUMMARIZER_MODEL]
                result.summarizer_calls = len(summarized)
                result.summarizer_tokens = sum(count_prompt_tokens(body["messages"]) for body in summarized)
                if not job.fallback:
                    for fact in facts.values():
                        client.append({"role": "user", "content": question(fact)})
                        seen = len(main_fake.requests)
                        client.call()
                        asked = [r.body for r in main_fake.requests[seen:] if r.body.get("model") == MAIN_MODEL]
                        prompt = "\n".join(content_text(m.get("content")) for m in asked[-1]["messages"][:-1])
                        result.recall_hits += fact.value in prompt
                        result.recalled += client.recalled[-1] > 0
                result.spans_foreground, result.spans_background = span_counts(proxy.url, session_id)
            except openai.APIError as exc:
                result.error = f"{type(exc).__name__} at call {len(client.latencies) + 1}: {exc}"[:600]
            result.rejected = [json.dumps(body)[:300] for body in main_fake.rejected]
    result.seconds = time.perf_counter() - started
    return result


def ratio(values: Sequence[float], quantile: float, normal: float) -> float | None:
    if not values or normal <= 0:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)] / normal


SESSION_COLUMNS = columns(
    ("session",), ("strategy_set", "strategy set"), ("calls",), ("crossings",), ("x_p50", "x p50", ".2f"),
    ("x_p95", "x p95", ".2f"), ("normal_p50_ms", "normal p50 ms", ".0f"), ("spans_fg", "spans fg"),
    ("spans_bg", "bg"), ("summarizer_calls", "summ calls"), ("tokens_k", "tokens (k)", ".0f"),
    ("summarizer_tokens_k", "summ (k)", ".0f"), ("vs_truncation", "vs truncation", ".2f"),
    ("prefix_stable", "prefix-stable", ".1%"), ("facts_llm", "facts llm"), ("facts_fallback", "facts fallback"),
    ("recall_hits", "recall"), ("recalled",),
)  # fmt: skip


def report_sessions(results: Sequence[JobResult], args: argparse.Namespace, report: Report) -> None:
    title = (
        f"Strategies over {args.turns} turns per session; main model {args.main_latency} s per answer, summarizer "
        f"{args.summarizer_latency} s per call; agent {SHAPES['agent'].window}-token window, chat "
        f"{SHAPES['chat'].window}; {args.jobs} jobs at once"
    )
    table = report.table("sessions", title, SESSION_COLUMNS)
    timed = {(r.job.row, r.job.shape): r for r in results if not r.job.fallback}
    fallback = {(r.job.row, r.job.shape): r for r in results if r.job.fallback}
    for (row_name, shape_name), result in timed.items():
        crossing = [s for s, c in zip(result.latencies, result.crossings, strict=True) if c]
        normal = [s for s, c in zip(result.latencies, result.crossings, strict=True) if not c]
        normal_p50 = statistics.median(normal) if normal else 0.0
        tokens = result.main_tokens + result.summarizer_tokens
        baseline = timed.get(("client truncation", shape_name))
        base_tokens = baseline.main_tokens + baseline.summarizer_tokens if baseline else 0
        other = fallback.get((row_name, shape_name))
        table.add(
            session=shape_name,
            strategy_set=row_name + (" (ERROR)" if result.error else ""),
            calls=len(result.latencies),
            crossings=len(crossing),
            x_p50=ratio(crossing, 0.5, normal_p50),
            x_p95=ratio(crossing, 0.95, normal_p50),
            normal_p50_ms=normal_p50 * 1000,
            spans_fg=result.spans_foreground,
            spans_bg=result.spans_background,
            summarizer_calls=result.summarizer_calls,
            tokens_k=tokens / 1000,
            summarizer_tokens_k=result.summarizer_tokens / 1000,
            vs_truncation=tokens / base_tokens if base_tokens else None,
            prefix_stable=sum(result.prefix_stable) / len(result.prefix_stable) if result.prefix_stable else None,
            facts_llm=f"{result.facts_kept}/{FACT_COUNT}",
            facts_fallback=(
                f"{other.facts_kept}/{FACT_COUNT}" + ("!" if other.error else "") if other else "n/a (no summarizer)"
            ),
            recall_hits=f"{result.recall_hits}/{FACT_COUNT}",
            recalled=result.recalled,
        )
    for result in results:
        kind = "fallback" if result.job.fallback else "llm-like"
        label = f"{result.job.shape} / {result.job.row} / {kind}"
        if result.error:
            table.notes.append(f"ERROR {label}: {result.error}")
        table.notes.extend(f"REJECTED by the main fake {label}: {rejected}" for rejected in result.rejected)
    seconds = ", ".join(
        f"{r.job.shape}/{r.job.row}/{'fb' if r.job.fallback else 'llm'} {r.seconds:.0f}" for r in results
    )
    table.notes.append(f"seconds per job: {seconds}")


def jobs(args: argparse.Namespace) -> list[Job]:
    rows = [ROWS[name] for name in args.only] if args.only else list(ROWS.values())
    shapes = [args.session] if args.session else list(SHAPES)
    planned: list[Job] = []
    for shape in shapes:
        for row in rows:
            for fallback in (False, True) if row.summarizes else (False,):
                planned.append(
                    Job(row.name, shape, args.turns, args.main_latency, args.summarizer_latency, fallback=fallback)
                )
    # The longest first, so that the pool ends together: agent sessions, then those waiting on the summarizer.
    return sorted(planned, key=lambda job: (job.shape != "agent", job.fallback, not ROWS[job.row].summarizes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS, help="user turns per session")
    parser.add_argument("--only", action="append", choices=list(ROWS), help="a strategy set (repeatable)")
    parser.add_argument("--session", choices=list(SHAPES), help="only this session kind")
    parser.add_argument("--main-latency", type=float, default=DEFAULT_MAIN_LATENCY_S, help="seconds per answer")
    parser.add_argument("--summarizer-latency", type=float, default=DEFAULT_SUMMARIZER_LATENCY_S)
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="sessions run at once (processes)")
    add_json_option(parser)
    args = parser.parse_args()
    report = Report.start("strategies", args)
    planned = jobs(args)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(run_job, planned))
    report_sessions(results, args, report)
    report.publish(args.json)


if __name__ == "__main__":
    main()
