"""A scripted long conversation through the served proxy, for the compaction end-to-end tests and benchmark.

The fake upstream plays two parts, told apart by the summarizer's instruction in the system message: the chat
model (answers of 40–80 tokens, a tool call when a user turn asks for one) and the summarizer (by default one
that keeps every planted `FACT-…` token). The client is the official OpenAI SDK re-sending its whole history
each turn with an `X-Session-Id`; every turn's upstream requests are recorded so that a test can check what
the model saw, turn by turn.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from proxy.compaction.recall import RECALL_HEADER
from proxy.compaction.stubs import STUB_PREFIX
from proxy.compaction.summary_text import ACKNOWLEDGEMENT, INSTRUCTION, SUMMARY_HEADER
from tests.support.fake_upstream import FakeUpstream, Reply, content_text

SYSTEM_PROMPT = "You are a helpful engineering assistant. Answer briefly."
FACTS: dict[int, str] = {
    3: "Remember: the deploy key is FACT-AZURE-7731.",
    5: "Remember: the database is at FACT-db.internal:5432.",
}
"""User turn (1-based) → the sentence planted in it."""
FACT_TOKENS = ("FACT-AZURE-7731", "FACT-db.internal:5432")
FACT_PATTERN = re.compile(r"FACT-[A-Za-z0-9.:-]*[A-Za-z0-9]")
TOOL_MARKER = "Please look at the file with the tool."
"""A user turn containing this gets a tool call from the fake chat model."""
TOOL_NAME = "read_file"
TOOL_CALLS_PER_TURN = 2
"""Parallel calls per tool turn: a tool group is then an assistant message and two tool results."""

USER_WORDS = (48, 120)
"""Words of filler per user turn: about 60–150 tokens."""
ANSWER_WORDS = (32, 64)
"""Words per answer: about 40–80 tokens."""
TOOL_OUTPUT_WORDS = 100
SENTENCE_WORDS = (6, 14)

_VOCABULARY_TEXT = """
    the a of and to in is that for it as was with be by on this are or from at which but have an they you were
    there would their we been has when who will more if out so said what up its about into than them can only
    other some could time these two may then do first any my now such like our over even most made after also
    did many before through back years where much your way well down because each just those people how too
    little state good very make world still own see men work long get here between both life being under never
    day same another know while last might great old year off come since against go came right used take three
    proxy session summary token budget context stream journal message chain branch compaction upstream model
    window cache prompt reply answer request client server table column index query layout render parser
"""
VOCABULARY = tuple(_VOCABULARY_TEXT.split())
"""Plain words only: no digits, paths, identifiers or task words, so the extractive fallback keeps the facts."""

SUMMARIZER_MARK = INSTRUCTION.split("{target}", 1)[0]
_TARGET = re.compile(r"at most about (\d+) tokens")


def is_summarizer_request(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages") or []
    return (
        bool(messages)
        and messages[0].get("role") == "system"
        and (content_text(messages[0].get("content")).startswith(SUMMARIZER_MARK))
    )


def is_summary_message(message: Mapping[str, Any]) -> bool:
    return content_text(message.get("content")).startswith(SUMMARY_HEADER)


def filler(rng: random.Random, words: int) -> str:
    """`words` words of English-looking sentences."""
    sentences: list[str] = []
    left = words
    while left > 0:
        length = min(left, rng.randint(*SENTENCE_WORDS))
        chosen = [rng.choice(VOCABULARY) for _ in range(length)]
        sentences.append(" ".join(chosen).capitalize() + ".")
        left -= length
    return " ".join(sentences)


def seeded(text: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))


def chat_answer(body: Mapping[str, Any]) -> Reply:
    """The fake chat model: a tool call when asked for one, else 40–80 tokens derived from the last message."""
    messages = body["messages"]
    last = messages[-1]
    text = content_text(last.get("content"))
    rng = seeded(f"{len(messages)}:{text}")
    if last.get("role") == "user" and TOOL_MARKER in text:
        digest = hashlib.sha256(text.encode()).hexdigest()
        calls = [
            {
                "id": f"call_{digest[:10]}_{index}",
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": json.dumps({"path": f"src/module_{digest[index]}.py"})},
            }
            for index in range(TOOL_CALLS_PER_TURN)
        ]
        return Reply(tool_calls=calls)
    return Reply(content=filler(rng, rng.randint(*ANSWER_WORDS)))


def fact_keeping_summary(body: Mapping[str, Any]) -> Reply:
    """The fake summarizer: about its target in length, and every planted fact of the transcript kept."""
    instruction = content_text(body["messages"][0].get("content"))
    transcript = content_text(body["messages"][-1].get("content"))
    match = _TARGET.search(instruction)
    target = int(match.group(1)) if match else 64
    facts = list(dict.fromkeys(FACT_PATTERN.findall(transcript)))
    rng = seeded(transcript)
    kept = f" Facts: {', '.join(facts)}." if facts else ""
    return Reply(content=filler(rng, max(8, target * 2 // 3)) + kept)


def empty_summary(body: Mapping[str, Any]) -> Reply:
    return Reply(content="")


Summarize = Callable[[Mapping[str, Any]], Reply]


def install_responder(fake: FakeUpstream, summarize: Summarize = fact_keeping_summary) -> None:
    def respond(body: dict[str, Any]) -> Reply:
        return summarize(body) if is_summarizer_request(body) else chat_answer(body)

    fake.responder = respond


@dataclass
class TurnRecord:
    """One user turn: what the client saw and what reached the upstream while it ran."""

    number: int
    model: str
    headers: dict[str, str]
    """Response headers of the turn's last request."""
    chat_requests: list[list[dict[str, Any]]]
    """Messages of each chat request the upstream received (more than one for a tool round or a retry)."""
    answers: list[dict[str, Any]]
    """The assistant messages the client appended, one per request it made."""
    summarizer_requests: int
    seconds: float
    """Client-side wall time of the whole turn."""
    client_messages: list[dict[str, Any]]
    """The client's history as sent in the turn's last request."""

    @property
    def compacted(self) -> bool:
        return self.summarizer_requests > 0


@dataclass
class ScriptedSession:
    """A client that re-sends its whole history each turn, with the fake upstream scripted to match."""

    client: openai.OpenAI
    fake: FakeUpstream
    session_id: str
    model: str = "small"
    seed: int = 7
    tool_every: int = 0
    """Every n-th user turn asks for a tool call (0: never)."""
    stream_every: int = 0
    """Every n-th user turn is streamed (0: never)."""
    facts: Mapping[int, str] = field(default_factory=lambda: dict(FACTS))
    """User turn → a fact sentence planted in it."""
    tools: list[dict[str, Any]] | None = None
    """Function definitions sent with every request (an agent's), none by default."""
    messages: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "system", "content": SYSTEM_PROMPT}])
    turns: list[TurnRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def user_text(self, number: int) -> str:
        text = filler(self._rng, self._rng.randint(*USER_WORDS))
        if number in self.facts:
            sentences = text.split(". ")
            sentences.insert(len(sentences) // 2, self.facts[number].rstrip("."))
            text = ". ".join(sentences)
        if self.tool_every and number % self.tool_every == 0:
            text += " " + TOOL_MARKER
        return text

    def run(self, turns: int, **options: Any) -> list[TurnRecord]:
        return [self.turn(**options) for _ in range(turns)]

    def turn(
        self, *, model: str | None = None, stream: bool | None = None, headers: Mapping[str, str] | None = None
    ) -> TurnRecord:
        """One user turn (and its tool round, if the model calls a tool)."""
        number = len(self.turns) + 1
        model = model or self.model
        if stream is None:
            stream = bool(self.stream_every) and number % self.stream_every == 0
        self.messages.append({"role": "user", "content": self.user_text(number)})
        seen = len(self.fake.requests)
        started = time.perf_counter()
        answer, response_headers = self.send(model, stream, headers or {})
        answers = [answer]
        self.messages.append(answer)
        for call in answer.get("tool_calls") or []:
            output = filler(seeded(call["id"]), TOOL_OUTPUT_WORDS)
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        if answer.get("tool_calls"):
            answer, response_headers = self.send(model, stream, headers or {})
            answers.append(answer)
            self.messages.append(answer)
        seconds = time.perf_counter() - started
        new = [request.body for request in self.fake.requests[seen:]]
        record = TurnRecord(
            number=number,
            model=model,
            headers=response_headers,
            chat_requests=[body["messages"] for body in new if not is_summarizer_request(body)],
            answers=answers,
            summarizer_requests=sum(1 for body in new if is_summarizer_request(body)),
            seconds=seconds,
            client_messages=[dict(m) for m in self.messages[:-1]],
        )
        self.turns.append(record)
        return record

    def send(self, model: str, stream: bool, headers: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        """The assistant message the client appends, and the response headers."""
        extra = {"X-Session-Id": self.session_id, **headers}
        messages = cast("list[ChatCompletionMessageParam]", self.messages)
        tools: Any = self.tools if self.tools is not None else openai.NOT_GIVEN
        if not stream:
            raw = self.client.chat.completions.with_raw_response.create(
                model=model, messages=messages, tools=tools, extra_headers=extra
            )
            completion = raw.parse()
            assert isinstance(completion, ChatCompletion)
            message = completion.choices[0].message
            answer: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                answer["tool_calls"] = [
                    call.model_dump(include={"id", "type", "function"}) for call in message.tool_calls
                ]
            return answer, dict(raw.headers.items())
        with self.client.chat.completions.with_streaming_response.create(
            model=model, messages=messages, stream=True, tools=tools, extra_headers=extra
        ) as response:
            chunks = list(response.parse())
            return assemble(chunks), dict(response.headers.items())


def assemble(chunks: Sequence[ChatCompletionChunk]) -> dict[str, Any]:
    """The assistant message a streamed answer adds up to."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for call in delta.tool_calls or []:
                slot = calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if call.id:
                    slot["id"] = call.id
                if call.function and call.function.name:
                    slot["function"]["name"] += call.function.name
                if call.function and call.function.arguments:
                    slot["function"]["arguments"] += call.function.arguments
    answer: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        answer["tool_calls"] = [calls[index] for index in sorted(calls)]
    return answer


def comparable(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """A message as the model sees it (role, text, tool calls, call id), whatever optional keys travel along."""
    calls = tuple(
        (call.get("id"), call["function"].get("name"), call["function"].get("arguments"))
        for call in message.get("tool_calls") or []
    )
    return message.get("role"), content_text(message.get("content")), calls, message.get("tool_call_id")


M = TypeVar("M", bound=Mapping[str, Any])


def prefix_breaks(turns: Sequence[TurnRecord]) -> list[int]:
    """Turns whose chat request does not extend the previous chat request plus its answer (invariant 6; a
    recall is for its turn only: `extends`)."""
    breaks: list[int] = []
    previous: list[Mapping[str, Any]] | None = None
    for turn in turns:
        for request, answer in zip(turn.chat_requests, turn.answers, strict=True):
            if previous is not None and not extends(previous, request, comparable):
                breaks.append(turn.number)
            previous = [*request, answer]
    return breaks


def recall_taken_out(messages: Sequence[M]) -> list[M]:
    """The messages without the recall and the acknowledgements the proxy put around it (just before the latest
    user message)."""
    recalled = [i for i, m in enumerate(messages) if content_text(m.get("content")).startswith(RECALL_HEADER)]
    if not recalled:
        return list(messages)
    [at] = recalled
    start, end = at, at + 1
    if end < len(messages) and _acknowledges(messages[end]):
        end += 1
    if start >= 2 and _acknowledges(messages[start - 1]) and messages[start - 2].get("role") == "user":
        start -= 1
    return [*messages[:start], *messages[end:]]


def _acknowledges(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant" and content_text(message.get("content")) == ACKNOWLEDGEMENT


def extends(
    earlier: Sequence[Mapping[str, Any]], later: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Any]
) -> bool:
    """Is `later` (by `key`) an extension of `earlier`, as a provider's prompt cache sees it? Strictly; or, on a
    new turn (a user message more), once each is without its recall: a recall stands just before its turn's user
    message for that turn only (invariant 6), so the cache reuses what came before it. Within a turn the recall
    must stay as it was."""
    if [key(m) for m in later[: len(earlier)]] == [key(m) for m in earlier]:
        return True
    before, after = recall_taken_out(earlier), recall_taken_out(later)
    if _users(after) <= _users(before):
        return False
    return [key(m) for m in after[: len(before)]] == [key(m) for m in before]


def _users(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for message in messages if message.get("role") == "user")


def shrinking(turns: Sequence[TurnRecord]) -> list[int]:
    """Turns where the working context lost something: it is smaller than the one before, in tokens or in what
    it shows without its recall (a question's fill takes the context to its budget, so a crossing may send as
    many tokens as the filled turn before; a summary written in the background is used at the crossing, with no
    summarizer call of its own), or it stubs more tool outputs (a crossing that masked, and needed no more)."""
    return [
        turn.number
        for previous, turn in itertools.pairwise(turns)
        if int(turn.headers["x-context-tokens"]) < int(previous.headers["x-context-tokens"])
        or shown(turn.chat_requests[-1]) < shown(previous.chat_requests[-1])
        or stubs(turn.chat_requests[-1]) > stubs(previous.chat_requests[-1])
    ]


def shown(messages: Sequence[Mapping[str, Any]]) -> int:
    """Characters of the messages' contents, the recall taken out."""
    return sum(len(content_text(m.get("content"))) for m in recall_taken_out(messages))


def stubs(messages: Sequence[Mapping[str, Any]]) -> int:
    """Tool outputs sent as the proxy's stubs."""
    return sum(
        1 for m in messages if m.get("role") == "tool" and content_text(m.get("content")).startswith(STUB_PREFIX)
    )


def without_nulls(value: Any) -> Any:
    """A JSON value without its null fields: `"content": null` and an absent content are the same request."""
    if isinstance(value, Mapping):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def after_system_prompt(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """A request's messages after the client's leading system messages, each as JSON without null fields.

    Summaries are kept: they belong to the part of the prompt that a provider's cache can reuse.
    """
    return [as_sent(message) for message in messages[system_prompt_length(messages) :]]


def system_prompt_length(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many leading messages are the client's system messages (a summary is not one)."""
    start = 0
    while (
        start < len(messages)
        and messages[start].get("role") in ("system", "developer")
        and not is_summary_message(messages[start])
    ):
        start += 1
    return start


def as_sent(message: Mapping[str, Any]) -> str:
    """A message as JSON without null fields."""
    return json.dumps(without_nulls(message), sort_keys=True)


def prefix_extensions(requests: Sequence[Sequence[Mapping[str, Any]]]) -> list[bool]:
    """For each pair of consecutive requests: are the earlier one's messages after the system prompt a prefix of
    the later one's (`extends`)? (Invariant 6 whatever the system prompt does; one entry per pair, in order.)"""
    parts = [messages[system_prompt_length(messages) :] for messages in requests]
    return [extends(earlier, later, as_sent) for earlier, later in itertools.pairwise(parts)]
