"""Real tools' conversations through the served proxy (issue 11, items 1, 2, 3 and 8, and its 100-turn check).

Agents rebuild their system prompt every turn (a clock, the working directory), restore their history from a
file with its whitespace changed, open every chat with the same few-shot examples, and send `max_tokens`. The
client here does the same with the official OpenAI SDK on a 4k "small" model (as in `test_compaction_e2e`), with
a "summarizer" model; the fake upstream plays the chat model (a tool call when asked, its id sometimes the
`call_0` that some local servers reuse) and the summarizer. A comparison runs one script twice — clock running,
clock stopped — on two proxies with their own stores, so summarizer calls and stored rows can be compared.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import (
    fact_keeping_summary,
    filler,
    is_summarizer_request,
    prefix_extensions,
    seeded,
    without_nulls,
)

SMALL_WINDOW = 4096
MAX_OUTPUT = 512
SAFETY_MARGIN_TOKENS = 205
"""⌈5 % of 4096⌉."""
SMALL_BUDGET = SMALL_WINDOW - MAX_OUTPUT - SAFETY_MARGIN_TOKENS
"""The small model's default input budget: 3379."""

SYSTEM_TEMPLATE = (
    "You are a coding agent. Current time: 2026-11-23T10:{minute:02d}:{second:02d}. "
    "Working directory: /home/dev/shop/{folder}."
)
"""Every variant has the same token count, so the clock alone cannot move a compaction by a turn."""
FOLDERS = ("api", "web", "lib", "src")
TOOL_REQUEST = "Please read the file with the tool."
"""A user turn containing this gets a tool call from the fake chat model."""
REUSED_CALL_ID = "call_0"
TOOL_NAME = "read_file"
PRESERVE_RECENT = 4
"""The config's default: a restore leaves these last messages alone, as they are sent verbatim anyway."""

Words = tuple[int, int]
LONG_USER_WORDS: Words = (100, 130)
"""Per paragraph (two per user turn): a 16-turn conversation outgrows the 4k window about twice."""
LONG_ANSWER_WORDS: Words = (30, 60)
SHORT_USER_WORDS: Words = (5, 12)
SHORT_ANSWER_WORDS: Words = (10, 25)
TOOL_OUTPUT_WORDS: Words = (20, 40)
LEADING_NEWLINE_SHARE = 0.3
"""Of the fake's text answers, those that start with a newline (a restore then removes it)."""

DRIFT_TURNS = 16
MAX_TURNS_TO_COMPACT = 40
MAX_TOKENS = 100
BUDGET_WITH_MAX_TOKENS = SMALL_WINDOW - MAX_TOKENS - SAFETY_MARGIN_TOKENS
SESSION_BUDGET = 2000
AGENT_TURNS = 100
TOOL_EVERY = 4
RESTORE_EVERY = 25
EXTENDING_SHARE = 0.9

FEW_SHOT: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "Change get_factorial() to use math.factorial"},
    {
        "role": "assistant",
        "content": "To make this change we need to modify `mathweb/flask/app.py` to import math and call "
        "math.factorial() in get_factorial().",
    },
    {"role": "user", "content": "Refactor hello() into its own file."},
    {"role": "assistant", "content": "To make this change we need to create `hello.py` and import it in `main.py`."},
)
"""An opening every chat of a tool shares, as aider's example messages are."""


def system_prompt(tick: int) -> str:
    return SYSTEM_TEMPLATE.format(minute=tick // 60, second=tick % 60, folder=FOLDERS[tick % len(FOLDERS)])


def user_text(turn: int, words: Words, tool: bool = False) -> str:
    """Two paragraphs: restores add trailing spaces to each line."""
    rng = seeded(f"user turn {turn}")
    text = f"Task {turn}: {filler(rng, rng.randint(*words))}\n\n{filler(rng, rng.randint(*words))}"
    return f"{text} {TOOL_REQUEST}" if tool else text


def tool_output(call: Mapping[str, Any]) -> str:
    rng = seeded(json.dumps(call, sort_keys=True))
    return filler(rng, rng.randint(*TOOL_OUTPUT_WORDS))


def restored(text: str) -> str:
    """The text as a tool restores it from its history file: trailing spaces on its lines, the leading newline
    added or removed."""
    spaced = "\n".join(f"{line}  " if line else line for line in text.split("\n"))
    return spaced.removeprefix("\n") if spaced.startswith("\n") else "\n" + spaced


def agent_reply(body: Mapping[str, Any], answer_words: Words) -> Reply:
    """The fake chat model: one tool call when asked (half of them reuse `call_0`), else a short answer."""
    messages = body["messages"]
    last = messages[-1]
    text = content_text(last.get("content"))
    if last.get("role") == "user" and TOOL_REQUEST in text:
        rng = seeded(text)
        call_id = REUSED_CALL_ID if rng.random() < 0.5 else f"call_{rng.getrandbits(40):010x}"
        arguments = json.dumps({"path": f"src/{rng.choice(FOLDERS)}/module.py"})
        return Reply(
            tool_calls=[{"id": call_id, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}]
        )
    rng = seeded(f"{len(messages)}:{text}")
    lead = "\n" if rng.random() < LEADING_NEWLINE_SHARE else ""
    return Reply(content=lead + filler(rng, rng.randint(*answer_words)))


def install_agent(fake: FakeUpstream, answer_words: Words) -> None:
    fake.context_window = SMALL_WINDOW

    def respond(body: dict[str, Any]) -> Reply:
        return fact_keeping_summary(body) if is_summarizer_request(body) else agent_reply(body, answer_words)

    fake.responder = respond


@dataclass
class Sent:
    """One request of the agent: the system prompt it carried, its response headers, what reached the upstream."""

    system: str
    headers: dict[str, str]
    chat_requests: list[list[dict[str, Any]]]
    summarizer_requests: int

    @property
    def session_id(self) -> str:
        return self.headers["x-session-id"]

    @property
    def budget(self) -> int:
        return int(self.headers["x-context-budget"])


@dataclass
class Agent:
    """A client as agents are: a fresh system prompt per request (clock and working directory when `clock`),
    its whole history re-sent, a tool round whenever the model calls a tool. Any error status fails the test."""

    client: openai.OpenAI
    fake: FakeUpstream
    name: str
    """Names the run in a failure."""
    clock: bool = True
    session_id: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    """Everything after the system prompt."""
    sent: list[Sent] = field(default_factory=list)

    @property
    def summarizer_calls(self) -> int:
        return sum(sent.summarizer_requests for sent in self.sent)

    @property
    def chat_requests(self) -> list[list[dict[str, Any]]]:
        return [request for sent in self.sent for request in sent.chat_requests]

    def turn(self, text: str, headers: Mapping[str, str] | None = None, max_tokens: int | None = None) -> Sent:
        """One user turn and its tool round; the last request's record."""
        self.history.append({"role": "user", "content": text})
        sent = self.send(headers or {}, max_tokens)
        calls = self.history[-1].get("tool_calls") or []
        for call in calls:
            self.history.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output(call)})
        if calls:
            sent = self.send({}, max_tokens)
        return sent

    def restore(self) -> int:
        """Rewrite the whitespace of every text older than the recent messages, as a restored history file has
        it; returns how many messages changed."""
        older = [
            message
            for message in self.history[: len(self.history) - PRESERVE_RECENT]
            if message["role"] in ("user", "assistant") and isinstance(message.get("content"), str)
        ]
        for message in older:
            message["content"] = restored(message["content"])
        return len(older)

    def send(self, headers: Mapping[str, str], max_tokens: int | None) -> Sent:
        system = system_prompt(len(self.sent) if self.clock else 0)
        messages = cast("list[ChatCompletionMessageParam]", [{"role": "system", "content": system}, *self.history])
        extra = {**({"X-Session-Id": self.session_id} if self.session_id else {}), **headers}
        seen = len(self.fake.requests)
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model="small",
                messages=messages,
                extra_headers=extra,
                max_tokens=openai.omit if max_tokens is None else max_tokens,
            )
        except openai.APIStatusError as exc:
            pytest.fail(f"{self.name}: request {len(self.sent) + 1} failed: {exc.status_code} {exc.message}")
        message = raw.parse().choices[0].message
        answer: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            answer["tool_calls"] = [call.model_dump(include={"id", "type", "function"}) for call in message.tool_calls]
        self.history.append(answer)
        bodies = [request.body for request in self.fake.requests[seen:]]
        sent = Sent(
            system=system,
            headers=dict(raw.headers.items()),
            chat_requests=[body["messages"] for body in bodies if not is_summarizer_request(body)],
            summarizer_requests=sum(1 for body in bodies if is_summarizer_request(body)),
        )
        self.sent.append(sent)
        return sent


Connect = Callable[[ProxyServer], openai.OpenAI]


@pytest.fixture
def connect() -> Iterator[Connect]:
    """SDK clients for proxies, closed after the test."""
    clients: list[openai.OpenAI] = []

    def make(proxy: ProxyServer) -> openai.OpenAI:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def start(serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, name: str) -> ProxyServer:
    """A proxy with the small model and the summarizer (told apart upstream by its model name), on its own store."""
    common = {"api_base": fake.url, "api_key": "sk-x", "context_window": SMALL_WINDOW, "max_output": MAX_OUTPUT}
    return serve_proxy(
        store={"path": str(tmp_path / f"{name}.db")},
        models=[
            {"name": "small", "model": "openai/fake-model", **common},
            {"name": "summarizer", "model": "openai/fake-summarizer", **common},
        ],
        context={"summarizer_model": "summarizer"},
    )


def session_view(proxy: ProxyServer, session_id: str) -> dict[str, Any]:
    response = httpx.get(f"{proxy.url}/sessions/{session_id}", timeout=10)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def message_rows(proxy: ProxyServer) -> int:
    with contextlib.closing(sqlite3.connect(proxy.config.store.path)) as db:
        count: int = db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        return count


def dump(proxy: ProxyServer) -> str:
    """The store as `sqlite3 store.db .dump` prints it."""
    with contextlib.closing(sqlite3.connect(proxy.config.store.path)) as db:
        return "\n".join(db.iterdump())


def listed_sessions(proxy: ProxyServer) -> list[str]:
    response = httpx.get(f"{proxy.url}/sessions", timeout=10)
    assert response.status_code == 200, response.text
    return [session["id"] for session in response.json()["data"]]


def one_session(sent: Sequence[Sent]) -> str:
    ids = [record.session_id for record in sent]
    assert set(ids) == {ids[0]}, f"{len(set(ids))} sessions for one conversation: {ids}"
    return ids[0]


# 1 — a system prompt that changes every turn.


def drifting_conversation(agent: Agent) -> None:
    for turn in range(1, DRIFT_TURNS + 1):
        agent.turn(user_text(turn, LONG_USER_WORDS))


@pytest.mark.parametrize("session_header", [None, "drifting"], ids=["derived-session", "x-session-id"])
def test_a_system_prompt_that_changes_every_turn_stays_one_conversation(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, connect: Connect, session_header: str | None
) -> None:
    install_agent(fake, LONG_ANSWER_WORDS)
    fixed = Agent(
        connect(start(serve_proxy, fake, tmp_path, "fixed")),
        fake,
        "fixed prompt",
        clock=False,
        session_id=session_header,
    )
    drifting_conversation(fixed)
    proxy = start(serve_proxy, fake, tmp_path, "drifting")
    agent = Agent(connect(proxy), fake, "drifting prompt", clock=True, session_id=session_header)

    drifting_conversation(agent)

    systems = [sent.system for sent in agent.sent]
    assert len(set(systems)) == DRIFT_TURNS
    assert fixed.summarizer_calls >= 1, "the conversation must outgrow the window for the comparison to mean much"
    session_id = one_session(agent.sent)
    assert listed_sessions(proxy) == [session_id]
    for sent in agent.sent:
        for request in sent.chat_requests:
            assert without_nulls(request[0]) == {"role": "system", "content": sent.system}
    if session_header is None:
        assert agent.summarizer_calls <= fixed.summarizer_calls
    else:
        assert agent.summarizer_calls == fixed.summarizer_calls
    distinct = {json.dumps(message, sort_keys=True) for message in agent.history}
    assert message_rows(proxy) <= len(distinct) + 1
    stored = dump(proxy)
    assert [system for system in systems if system not in stored] == []


# 2 — history re-sent with its whitespace changed.


@pytest.mark.parametrize("session_header", [None, "restored"], ids=["derived-session", "x-session-id"])
def test_history_resent_with_changed_whitespace_keeps_its_session_summaries_and_rows(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, connect: Connect, session_header: str | None
) -> None:
    install_agent(fake, LONG_ANSWER_WORDS)
    proxy = start(serve_proxy, fake, tmp_path, "restored")
    agent = Agent(connect(proxy), fake, "restored", clock=False, session_id=session_header)
    for turn in range(1, MAX_TURNS_TO_COMPACT + 1):
        compacted = agent.turn(user_text(turn, LONG_USER_WORDS))
        if compacted.summarizer_requests and int(compacted.headers["x-context-summaries"]) > 0:
            break
    else:
        pytest.fail(f"no summary after {MAX_TURNS_TO_COMPACT} turns")
    session_id = one_session(agent.sent)
    rows = message_rows(proxy)
    older = agent.history[: len(agent.history) - PRESERVE_RECENT]
    assert any(str(message["content"]).startswith("\n") for message in older), "a restore must remove a newline"

    assert agent.restore() == len(older)
    resent = agent.turn(user_text(turn + 1, LONG_USER_WORDS))

    assert resent.session_id == session_id
    assert resent.summarizer_requests == 0
    assert int(resent.headers["x-context-summaries"]) > 0
    assert message_rows(proxy) == rows + 2


# 3 — conversations that open the same way.


def test_conversations_that_open_alike_are_separate_sessions_with_their_own_settings(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, connect: Connect
) -> None:
    install_agent(fake, SHORT_ANSWER_WORDS)
    client = connect(start(serve_proxy, fake, tmp_path, "openings"))
    a = Agent(client, fake, "conversation A", clock=False, history=[dict(message) for message in FEW_SHOT])
    b = Agent(client, fake, "conversation B", clock=False, history=[dict(message) for message in FEW_SHOT])

    a.turn("Add a --verbose flag to cli.py.")
    b.turn("Rename the Order class to Purchase in models.py.")
    a.turn("Also log the flag's value at startup.", headers={"X-Context-Budget": str(SESSION_BUDGET)})
    b.turn("Update the tests that mention Order.")
    a.turn("Now document the flag in the README.")
    b.turn("And the migration that creates the table.")

    assert one_session(a.sent) != one_session(b.sent)
    assert [sent.budget for sent in a.sent] == [SMALL_BUDGET, SESSION_BUDGET, SESSION_BUDGET]
    assert [sent.budget for sent in b.sent] == [SMALL_BUDGET, SMALL_BUDGET, SMALL_BUDGET]


def test_a_budget_belongs_to_the_branch_it_was_sent_on(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, connect: Connect
) -> None:
    install_agent(fake, SHORT_ANSWER_WORDS)
    client = connect(start(serve_proxy, fake, tmp_path, "branches"))
    main = Agent(client, fake, "main line", clock=False, session_id="branches")
    main.turn("turn 1: list the modules")
    main.turn("turn 2: open the largest one")
    opening = [dict(message) for message in main.history[:2]]

    set_at_three = main.turn("turn 3: keep it short from now on", headers={"X-Context-Budget": str(SESSION_BUDGET)})
    main_four = main.turn("turn 4: summarize the module")
    branch = Agent(client, fake, "branch", clock=False, session_id="branches", history=opening)
    edited_two = branch.turn("turn 2, edited: open the smallest one")
    branch_three = branch.turn("turn 3 on the branch: and its tests")
    main_five = main.turn("turn 5: back on the main line")

    assert (set_at_three.budget, main_four.budget) == (SESSION_BUDGET, SESSION_BUDGET)
    assert (edited_two.budget, branch_three.budget) == (SMALL_BUDGET, SMALL_BUDGET)
    assert main_five.budget == SESSION_BUDGET


# 8 — the session view shows what the last request sent.


def expected_severity(percent: float) -> str:
    if percent > 90:
        return "red"
    return "yellow" if percent >= 70 else "green"


def assert_view_matches(proxy: ProxyServer, sent: Sent) -> float:
    """The view's usage is the request's X-Context-* headers; returns its percent."""
    headers = sent.headers
    tokens, budget = int(headers["x-context-tokens"]), int(headers["x-context-budget"])
    usage = session_view(proxy, sent.session_id)["usage"]
    shown = {key: usage[key] for key in ("context_tokens", "budget", "summaries_in_context", "text")}
    assert shown == {
        "context_tokens": tokens,
        "budget": budget,
        "summaries_in_context": int(headers["x-context-summaries"]),
        "text": headers["x-context-usage"],
    }
    percent = round(100 * tokens / budget, 1)
    assert usage["percent"] == percent
    assert usage["severity"] == expected_severity(percent)
    return percent


def test_the_session_view_shows_the_usage_of_the_last_request_sent(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, connect: Connect
) -> None:
    install_agent(fake, LONG_ANSWER_WORDS)
    proxy = start(serve_proxy, fake, tmp_path, "usage")
    agent = Agent(connect(proxy), fake, "usage", clock=False, session_id="usage")
    for turn in range(1, MAX_TURNS_TO_COMPACT + 1):
        compacted = agent.turn(user_text(turn, LONG_USER_WORDS), max_tokens=MAX_TOKENS)
        if compacted.summarizer_requests and int(compacted.headers["x-context-summaries"]) > 0:
            break
    else:
        pytest.fail(f"no summary after {MAX_TURNS_TO_COMPACT} turns")
    assert compacted.budget == BUDGET_WITH_MAX_TOKENS != SMALL_BUDGET

    assert_view_matches(proxy, compacted)
    for later in range(turn + 1, turn + MAX_TURNS_TO_COMPACT):
        filling = agent.turn(user_text(later, LONG_USER_WORDS), max_tokens=MAX_TOKENS)
        assert filling.summarizer_requests == 0, "the context never reached 70 % between two compactions"
        if assert_view_matches(proxy, filling) >= 70:
            break
    else:
        pytest.fail(f"the context stayed under 70 % for {MAX_TURNS_TO_COMPACT} turns")


# Done when — a hundred turns of an agent-like client.


def agent_script(agent: Agent) -> None:
    """Clock in the system prompt, a tool call every few turns, the history restored every 25 turns."""
    for turn in range(1, AGENT_TURNS + 1):
        if turn % RESTORE_EVERY == 0:
            agent.restore()
        agent.turn(user_text(turn, SHORT_USER_WORDS, tool=turn % TOOL_EVERY == 0))


def test_a_hundred_turn_agent_stays_one_session_that_keeps_its_prompt_cacheable(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, connect: Connect
) -> None:
    install_agent(fake, SHORT_ANSWER_WORDS)
    fixed = Agent(connect(start(serve_proxy, fake, tmp_path, "fixed")), fake, "fixed prompt", clock=False)
    agent_script(fixed)
    proxy = start(serve_proxy, fake, tmp_path, "agent")
    agent = Agent(connect(proxy), fake, "agent", clock=True)

    agent_script(agent)

    tool_rounds = AGENT_TURNS // TOOL_EVERY
    assert len(agent.sent) == AGENT_TURNS + tool_rounds
    call_ids = [call["id"] for message in agent.history for call in message.get("tool_calls") or []]
    assert len(call_ids) == tool_rounds
    assert call_ids.count(REUSED_CALL_ID) >= 2
    session_id = one_session(agent.sent)
    assert listed_sessions(proxy) == [session_id]
    assert fixed.summarizer_calls >= 1, "the script must outgrow the window for the comparison to mean much"
    assert agent.summarizer_calls <= fixed.summarizer_calls
    extending = prefix_extensions(agent.chat_requests)
    breaks = [index + 1 for index, extends in enumerate(extending) if not extends]
    assert len(breaks) <= (1 - EXTENDING_SHARE) * len(extending), f"requests that do not extend the previous: {breaks}"
