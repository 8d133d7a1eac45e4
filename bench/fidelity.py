"""What the proxy keeps of a long ordinary-language conversation, per question category, against plain truncation.

Each conversation (bench/harness/conversations.py: generated ones, and LoCoMo's when `--locomo PATH` is given) is
replayed through the proxy served in-process over the fake upstream, as one chat session per context window: the
client re-sends its whole history before each of the second speaker's turns, and the fake answers with that
turn. Then each question is sent as the last user message, and what the proxy forwarded (the fake keeps every
request's body) is scored: is every evidence turn there verbatim (`Speaker: text`), is the gold answer there as
a phrase (case and punctuation aside), and how much of the input budget (`X-Context-Budget`) it filled.
Baselines from the same messages and budget: plain truncation (the system prompt, the question and the most
recent messages that fit) and the full conversation (the ceiling: an answer phrase missing there is missing
from the conversation).

Two summarizer modes: `down` (an address nobody listens on: every summary is the extractive fallback) and `up`
(the fake summarizer writes the first words of every transcript line up to its target: a stand-in that
measures the plumbing, not a model's judgement); each mode's note says how its summaries were written and how
often the summarizer was tried (the proxy's /metrics). `--answer-url URL --answer-model NAME` also asks a real
OpenAI-compatible model (llama.cpp, vLLM; key from `$ANSWER_API_KEY`) each question over the proxy's and the
truncation's context, and scores its answer: correct when the gold phrase is in it.

LoCoMo (snap-research/locomo, `data/locomo10.zip` → `locomo10.json` or its per-conversation files) is
CC BY-NC 4.0: fine for measuring, not ours to ship; pass its path, never commit it.

Run by hand: `python bench/fidelity.py [--windows 4096,8192] [--modes down,up] [--generated 4] [--locomo PATH]
[--questions N] [--context KEY=VALUE ...] [--json PATH]` (`--context` sets a `context:` config key, e.g.
`headroom_turns=0` for the rule before issue 42).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import openai
import yaml
from openai.types.chat import ChatCompletionMessageParam

from bench.harness.conversations import Conversation, Question, generate, load_locomo, turn_text
from bench.harness.report import Report, Table, add_json_option, columns
from proxy.environment import prepare
from proxy.tokens import content_text, count_message, count_prompt
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyServer, free_port, make_config
from tests.support.scripted_session import is_summarizer_request

WINDOWS = (4096, 8192, 16384)
MODES = ("down", "up")
SYSTEM_PROMPT = "You are a friendly chat companion. Answer the last message briefly from the conversation."
QUESTION_REPLY = "I am not sure."
SUMMARIZER_WINDOW = 32_768
FAKE_WINDOW = 1_000_000
"""The fake never refuses: the proxy's own entries say how large each model's window is."""
START_ATTEMPTS = 3
"""A loaded machine can take longer than the test harness's start timeout to import the proxy."""
log = logging.getLogger("bench.fidelity")
_TARGET = re.compile(r"at most about (\d+) tokens")
_PUNCTUATION = re.compile(r"[^\w\s]")
_SPACES = re.compile(r"\s+")
_SAMPLE = re.compile(r"^(context_proxy_\w+)\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)


@dataclass(frozen=True)
class Scored:
    category: str
    evidence: bool | None
    """Every evidence turn verbatim in the context; None when the question names no turn the conversation has."""
    answer: bool
    filled: float
    """Tokens of the context / the input budget."""
    correct: bool | None = None
    """The real model's answer contains the gold phrase; None when no model was asked."""
    refused: bool = False
    """The proxy refused the question (a 4xx): nothing was forwarded, nothing kept."""


def normalized(text: str) -> str:
    return _SPACES.sub(" ", _PUNCTUATION.sub(" ", text.lower())).strip()


def score(
    context: Sequence[Mapping[str, Any]], question: Question, turns: Mapping[str, str], tokens: int, budget: int
) -> Scored:
    text = "\n".join(content_text(message.get("content"), "\n") for message in context)
    known = [turns[id_] for id_ in question.evidence if id_ in turns]
    evidence = all(turn in text for turn in known) if known else None
    answer = f" {normalized(question.answer)} " in f" {normalized(text)} "
    return Scored(question.category, evidence, answer, tokens / budget)


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    return count_prompt(count_message(message) for message in messages)


def truncated(
    system: dict[str, Any], history: Sequence[dict[str, Any]], question: dict[str, Any], budget: int
) -> list[dict[str, Any]]:
    """The system prompt, the question, and the most recent messages that fit `budget` with them."""
    used = prompt_tokens([system, question])
    start = len(history)
    while start > 0 and used + count_message(history[start - 1]) <= budget:
        start -= 1
        used += count_message(history[start])
    return [system, *history[start:], question]


def headline_summary(body: Mapping[str, Any]) -> Reply:
    """The fake summarizer of mode `up`: the first words of every transcript line, about its target in all."""
    instruction = content_text(body["messages"][0].get("content"))
    match = _TARGET.search(instruction)
    target = int(match.group(1)) if match else 64
    lines = [line for line in content_text(body["messages"][-1].get("content")).splitlines() if line.strip()]
    words = max(3, (target * 3 // 4) // max(1, len(lines)))
    return Reply(content="\n".join(" ".join(line.split()[:words]) for line in lines[1:-1]))


class Script:
    """The fake upstream's side: the scripted answer the client will append next, and the summarizer."""

    def __init__(self) -> None:
        self.next_reply = QUESTION_REPLY

    def respond(self, body: dict[str, Any]) -> Reply:
        return headline_summary(body) if is_summarizer_request(body) else Reply(content=self.next_reply)


@dataclass(frozen=True)
class Served:
    parts: tuple[FakeUpstream, Script, openai.OpenAI]
    proxy: ProxyServer


@contextmanager
def served(windows: Sequence[int], mode: str, context: Mapping[str, Any] | None = None) -> Iterator[Served]:
    script = Script()
    with FakeUpstream(context_window=FAKE_WINDOW) as fake, tempfile.TemporaryDirectory() as tmp:
        fake.responder = script.respond
        summarizer = fake.url if mode == "up" else f"http://127.0.0.1:{free_port()}/v1"
        common = {"model": "openai/fake-model", "api_key": "sk-bench"}
        models = [
            {"name": f"w{window}", "api_base": fake.url, "context_window": window, "max_output": window // 8, **common}
            for window in windows
        ]
        models.append(
            {"name": "summarizer", "api_base": summarizer, "context_window": SUMMARIZER_WINDOW, "max_output": 2048}
            | common
        )
        settings = {"summarizer_model": "summarizer", **(context or {})}
        config = make_config(Path(tmp), fake.url, models=models, context=settings)
        with started(config, Path(tmp)) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=120)
            yield Served((fake, script, client), proxy)


@contextmanager
def started(config: dict[str, Any], workdir: Path) -> Iterator[ProxyServer]:
    for attempt in range(1, START_ATTEMPTS + 1):
        server = ProxyServer(config, workdir)
        try:
            server.__enter__()
        except RuntimeError:
            if attempt == START_ATTEMPTS:
                raise
            log.warning("the proxy did not start (attempt %d of %d); again", attempt, START_ATTEMPTS)
            continue
        try:
            yield server
        finally:
            server.__exit__(None, None, None)
        return


def send(client: openai.OpenAI, model: str, session: str, messages: list[dict[str, Any]]) -> dict[str, str] | None:
    """The answer's headers, or None when the proxy refused the request (logged: the run goes on)."""
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=cast("list[ChatCompletionMessageParam]", messages),
            extra_headers={"X-Session-Id": session},
        )
    except openai.APIStatusError as exc:
        log.warning("session %s: the proxy refused a request of %d messages: %s", session, len(messages), exc)
        return None
    raw.parse()
    return dict(raw.headers.items())


def summaries_note(proxy: ProxyServer, mode: str) -> str:
    """How the run's summaries were written and how often the summarizer was tried, from the proxy's /metrics:
    with it down, the circuit breaker keeps the failed calls to a few per cool-down."""
    text = httpx.get(f"{proxy.url}/metrics", timeout=30).text
    totals: dict[str, float] = defaultdict(float)
    for name, labels, value in _SAMPLE.findall(text):
        if name == "context_proxy_compactions_total" and 'strategy="summarize"' in labels:
            totals[labels.split('outcome="')[1].split('"')[0]] += float(value)
        elif name == "context_proxy_summarizer_seconds_count":
            totals["calls " + labels.split('outcome="')[1].split('"')[0]] += float(value)
    return (
        f"summarizer {mode}: summaries by the model {totals['llm']:.0f}, extractive {totals['fallback']:.0f};"
        f" summarizer calls ok {totals['calls ok']:.0f}, failed {totals['calls error']:.0f}"
    )


def forwarded(fake: FakeUpstream) -> list[dict[str, Any]]:
    """The messages of the last chat request the fake received (not a summarizer's)."""
    chats = [request.body for request in fake.requests if not is_summarizer_request(request.body)]
    fake.requests.clear()
    return list(chats[-1]["messages"])


@dataclass(frozen=True)
class Answerer:
    """A real OpenAI-compatible model asked the questions (`--answer-url`)."""

    url: str
    model: str

    def correct(self, context: Sequence[Mapping[str, Any]], question: Question) -> bool:
        messages = [{"role": str(m["role"]), "content": content_text(m.get("content"), "\n")} for m in context]
        key = os.environ.get("ANSWER_API_KEY", "none")
        body = {"model": self.model, "messages": messages, "max_tokens": 64, "temperature": 0}
        response = httpx.post(
            f"{self.url}/chat/completions", json=body, timeout=300, headers={"authorization": f"Bearer {key}"}
        )
        response.raise_for_status()
        answer = str(response.json()["choices"][0]["message"]["content"] or "")
        return f" {normalized(question.answer)} " in f" {normalized(answer)} "


def replay(
    conversation: Conversation,
    window: int,
    mode: str,
    served_parts: tuple[FakeUpstream, Script, openai.OpenAI],
    questions: int | None,
    answerer: Answerer | None,
) -> dict[str, list[Scored]]:
    """Scores per context kind (`proxy`, `truncation`, `full`) over the conversation's questions."""
    fake, script, client = served_parts
    model, session = f"w{window}", f"{conversation.name}-{window}-{mode}"
    # An opening exchange of its own makes each replay its own chain (system messages are not part of one): the
    # proxy shares a chain's summaries between sessions, so the 16k replay would show the 4k replay's.
    history: list[dict[str, Any]] = [{"role": "user", "content": f"Replay {session}."}]
    system = {"role": "system", "content": SYSTEM_PROMPT}
    script.next_reply = "OK."
    send(client, model, session, [system, *history])
    history.append({"role": "assistant", "content": "OK."})
    refused, budget = 0, window - window // 8
    for message in conversation.messages():
        if message["role"] == "assistant" and history:
            script.next_reply = message["content"]
            replied = send(client, model, session, [system, *history])
            refused += replied is None
            budget = int(replied["x-context-budget"]) if replied is not None else budget
            fake.requests.clear()
        history.append(message)
    if refused:
        log.warning("session %s: %d of the conversation's requests were refused", session, refused)
    turns = {turn.id: turn_text(turn) for _, turn in conversation.turns()}
    results: dict[str, list[Scored]] = defaultdict(list)
    script.next_reply = QUESTION_REPLY
    for question in picked(conversation.questions, questions):
        asked = {"role": "user", "content": question.text}
        headers = send(client, model, session, [system, *history, asked])
        if headers is None:
            fake.requests.clear()
            known = any(id_ in turns for id_ in question.evidence)
            results["proxy"].append(Scored(question.category, False if known else None, False, 0.0, refused=True))
            kinds = {"truncation": truncated(system, history, asked, budget), "full": [system, *history, asked]}
            for kind, context in kinds.items():
                results[kind].append(score(context, question, turns, prompt_tokens(context), budget))
            continue
        budget = int(headers["x-context-budget"])
        proxied = forwarded(fake)
        cut = truncated(system, history, asked, budget)
        full = [system, *history, asked]
        kinds = {"proxy": proxied, "truncation": cut, "full": full}
        for kind, context in kinds.items():
            tokens = int(headers["x-context-tokens"]) if kind == "proxy" else prompt_tokens(context)
            scored = score(context, question, turns, tokens, budget)
            if answerer is not None and kind != "full":
                scored = Scored(**{**scored.__dict__, "correct": answerer.correct(context, question)})
            results[kind].append(scored)
    return results


def picked(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """At most `limit` questions, taken in turn from each category (in the order they come)."""
    by_category: dict[str, list[Question]] = defaultdict(list)
    for question in questions:
        by_category[question.category].append(question)
    rounds = itertools.zip_longest(*by_category.values())
    ordered = [question for round_ in rounds for question in round_ if question is not None]
    return ordered[:limit]


def share(values: Sequence[bool | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


METRICS = columns(
    ("category",),
    ("questions",),
    ("refused", "refused by the proxy"),
    ("evidence_proxy", "evidence kept: proxy", ".1%"),
    ("evidence_truncation", "truncation", ".1%"),
    ("evidence_full", "full", ".1%"),
    ("answer_proxy", "answer phrase: proxy", ".1%"),
    ("answer_truncation", "truncation", ".1%"),
    ("answer_full", "full", ".1%"),
    ("filled_proxy", "budget filled: proxy", ".1%"),
    ("filled_truncation", "truncation", ".1%"),
    ("correct_proxy", "model correct: proxy", ".1%"),
    ("correct_truncation", "truncation", ".1%"),
)


def add_rows(table: Table, results: Mapping[str, Sequence[Scored]]) -> None:
    categories = sorted({scored.category for scored in results["proxy"]})
    for category in [*categories, "all"]:
        picked = {kind: [s for s in scored if category in ("all", s.category)] for kind, scored in results.items()}
        refused = sum(s.refused for s in picked["proxy"])
        row: dict[str, Any] = {"category": category, "questions": len(picked["proxy"]), "refused": refused}
        for kind, scored in picked.items():
            row[f"evidence_{kind}"] = share([s.evidence for s in scored])
            row[f"answer_{kind}"] = share([s.answer for s in scored])
            answered = [s.filled for s in scored if not s.refused]
            row[f"filled_{kind}"] = sum(answered) / len(answered) if answered else None
            row[f"correct_{kind}"] = share([s.correct for s in scored])
        table.add(**row)


def conversations(args: argparse.Namespace) -> list[tuple[str, list[Conversation]]]:
    sets = [("generated", [generate(seed) for seed in range(args.generated)])] if args.generated else []
    if args.locomo is not None:
        sets.append(("locomo", load_locomo(args.locomo)[: args.locomo_conversations]))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)), help="context windows, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="summarizer modes: down, up")
    parser.add_argument("--generated", type=int, default=4, help="generated conversations (seeds 0..N-1)")
    parser.add_argument("--locomo", type=Path, help="LoCoMo's locomo10.json or a folder of its conversation files")
    parser.add_argument("--locomo-conversations", type=int, default=None, help="only the first N of LoCoMo's")
    parser.add_argument(
        "--questions", type=int, default=None, help="at most N questions per conversation, taken from each category"
    )
    parser.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a `context:` config key for the proxy (repeatable; the value read as YAML), e.g. headroom_turns=0",
    )
    parser.add_argument("--answer-url", help="an OpenAI-compatible API (…/v1) whose model answers the questions")
    parser.add_argument("--answer-model", default="default", help="the model name to ask at --answer-url")
    add_json_option(parser)
    args = parser.parse_args()
    prepare()
    logging.basicConfig(level=logging.WARNING)
    for quiet in ("proxy.compaction.summarizer", "proxy.compaction.spans", "proxy.upstream.failures"):
        logging.getLogger(quiet).setLevel(logging.ERROR)
    windows = [int(window) for window in args.windows.split(",")]
    answerer = Answerer(args.answer_url.rstrip("/"), args.answer_model) if args.answer_url else None
    report = Report.start("fidelity", args)
    sets = conversations(args)
    context = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.context)}
    for mode in args.modes.split(","):
        with served(windows, mode, context) as run:
            for data, chats in sets:
                results: dict[int, dict[str, list[Scored]]] = {w: defaultdict(list) for w in windows}
                for conversation in chats:
                    for window in windows:
                        replayed = replay(conversation, window, mode, run.parts, args.questions, answerer)
                        for kind, scored in replayed.items():
                            results[window][kind].extend(scored)
                for window in windows:
                    title = f"{data} ({len(chats)} conversations), {window}-token window, summarizer {mode}"
                    add_rows(report.table(f"{data}-{window}-{mode}", title, METRICS), results[window])
            report.notes.append(summaries_note(run.proxy, mode))
    report.publish(args.json)


if __name__ == "__main__":
    main()
