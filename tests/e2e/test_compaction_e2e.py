"""Compaction end to end: long sessions through the served proxy, the fake upstream and the official OpenAI SDK.

Three models share the fake upstream: "small" (4k window), "big" (32k) and "summarizer" (its LiteLLM model
string differs, so its calls are recognizable). The fake enforces the window of the model under test with
OpenAI's own `context_length_exceeded` 400 and its own o200k count, and rejects unpaired tool messages, so
a session that completes without an SDK error and without a retry proves that every working context fitted.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from proxy.compaction.stubs import STUB_PREFIX
from proxy.compaction.summary_text import ACKNOWLEDGEMENT
from proxy.config.schema import DEFAULT_HEADROOM_TURNS
from proxy.tokens import count_message
from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyServer, free_port
from tests.support.scripted_session import (
    FACT_TOKENS,
    FACTS,
    TOOL_CALLS_PER_TURN,
    ScriptedSession,
    TurnRecord,
    comparable,
    empty_summary,
    filler,
    install_responder,
    is_summarizer_request,
    is_summary_message,
    prefix_breaks,
    recall_taken_out,
    seeded,
    shrinking,
)

SMALL_WINDOW = 4096
BIG_WINDOW = 32768
MAX_OUTPUT = 512
SMALL_BUDGET = 3379
"""4096 − 512 reserved output − ⌈5 % of 4096⌉ safety margin."""
BIG_BUDGET = 30617
"""32768 − 512 − ⌈5 % of 32768⌉."""
PRESERVE_RECENT = 4
SUMMARIZER_MODEL_ID = "fake-summarizer"
USAGE = re.compile(r"^(\d+(?:\.\d)?k?) / (\d+(?:\.\d)?k?) \((\d+)%\)(?: \[(\d+)S\])?$")


def model_entries(url: str, summarizer_base: str | None = None) -> list[dict[str, Any]]:
    common = {"model": "openai/fake-model", "api_base": url, "api_key": "sk-x", "max_output": MAX_OUTPUT}
    return [
        {"name": "small", **common, "context_window": SMALL_WINDOW},
        {"name": "big", **common, "context_window": BIG_WINDOW},
        {
            "name": "summarizer",
            **common,
            "model": f"openai/{SUMMARIZER_MODEL_ID}",
            "api_base": summarizer_base or url,
            "context_window": SMALL_WINDOW,
        },
    ]


def start(
    serve_proxy: ServeProxy, fake: FakeUpstream, summarizer_base: str | None = None, **context: Any
) -> tuple[ProxyServer, openai.OpenAI]:
    """The proxy on the fake, its summarizer the "summarizer" model; `context` adds keys to the context section."""
    proxy = serve_proxy(
        models=model_entries(fake.url, summarizer_base), context={"summarizer_model": "summarizer", **context}
    )
    return proxy, openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30)


def session_view(proxy: ProxyServer, session_id: str) -> dict[str, Any]:
    response = httpx.get(f"{proxy.url}/sessions/{session_id}", timeout=10)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def fitting(fake: FakeUpstream, window: int) -> None:
    """Every request the fake received fitted `window` by its own count: it rejected none for its length."""
    for request in fake.requests:
        body = request.body
        reserved = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        assert fake.count_tokens(body["messages"]) + reserved <= window


def assert_no_retries(turns: Sequence[TurnRecord]) -> None:
    """One upstream chat request per client request: nothing was rejected and healed behind the client's back."""
    for turn in turns:
        assert len(turn.chat_requests) == len(turn.answers), f"turn {turn.number} was retried"


def is_acknowledgement(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant" and message.get("content") == ACKNOWLEDGEMENT


def working_context(turn: TurnRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(summary messages, original messages) of the turn's last upstream chat request, checked for shape.

    The system prompt first, then summaries (with the acknowledgements that keep the turns alternating), then a
    contiguous suffix of the client's history of at least `PRESERVE_RECENT` messages, verbatim (invariants 3
    and 5) but for older tool outputs sent as their stubs.
    """
    request, history = turn.chat_requests[-1], turn.client_messages
    assert comparable(request[0]) == comparable(history[0])
    head = 1
    while head < len(request) and (is_summary_message(request[head]) or is_acknowledgement(request[head])):
        head += 1
    summaries = [message for message in request[1:head] if is_summary_message(message)]
    originals = recall_taken_out(request[head:])
    assert not any(is_summary_message(message) for message in originals)
    assert len(originals) >= min(PRESERVE_RECENT, len(history) - 1)
    suffix = history[len(history) - len(originals) :]
    older = len(originals) - PRESERVE_RECENT
    for index, (sent, original) in enumerate(zip(originals, suffix, strict=True)):
        if index < older and str(sent.get("content")).startswith(STUB_PREFIX):
            # tool-results: an old tool output is sent as its stub, where it stands, answering the same call.
            assert (sent["role"], sent["tool_call_id"]) == ("tool", original["tool_call_id"])
        else:
            assert comparable(sent) == comparable(original)
    return summaries, originals


def check_headers(turn: TurnRecord, budget: int) -> int:
    """The X-Context-* headers of one turn, consistent with each other; returns the summaries in context."""
    headers = turn.headers
    tokens, summaries = int(headers["x-context-tokens"]), int(headers["x-context-summaries"])
    assert int(headers["x-context-budget"]) == budget
    assert tokens <= budget
    assert int(headers["x-context-history-tokens"]) >= tokens or summaries > 0
    usage = USAGE.match(headers["x-context-usage"])
    assert usage is not None, headers["x-context-usage"]
    assert int(usage.group(3)) == round(100 * tokens / budget)
    assert int(usage.group(4) or 0) == summaries
    return summaries


def summary_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(str(message["content"]) for message in messages)


# 1, 2, 3, 10 — a hundred turns on the 4k model.


def test_hundred_turns_on_the_small_model_fit_keep_the_facts_and_extend_the_prompt(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "hundred", stream_every=10)

    turns = session.run(100)

    assert len(turns) == 100
    fitting(fake, SMALL_WINDOW)
    assert_no_retries(turns)
    for turn in turns:
        working_context(turn)
        check_headers(turn, SMALL_BUDGET)
    assert any(turn.number % 10 == 0 and int(turn.headers["x-context-summaries"]) > 0 for turn in turns)
    summarizer_bodies = [r.body for r in fake.requests if is_summarizer_request(r.body)]
    assert summarizer_bodies
    assert {body["model"] for body in summarizer_bodies} == {SUMMARIZER_MODEL_ID}

    summaries, originals = working_context(turns[-1])
    assert summaries[0]["content"].startswith("[Earlier conversation summary]")
    for fact in FACT_TOKENS:
        assert fact in summary_text(summaries)
        assert not any(fact in str(message.get("content")) for message in originals)
    planted = [comparable(m) for m in session.messages if any(f in str(m.get("content")) for f in FACT_TOKENS)]
    assert len(planted) == len(FACTS)
    assert not set(planted) & {comparable(m) for m in turns[-1].chat_requests[-1]}

    compactions = [turn.number for turn in turns if turn.compacted]
    # A summary written in the background (pre-compaction) is used at the crossing, a turn later: the prompt
    # changes where the context shrinks, and no more often than summaries are written.
    shrunk = shrinking(turns)
    breaks = prefix_breaks(turns)
    assert breaks
    assert set(breaks) <= set(shrunk)
    assert len(breaks) <= len(compactions) < 20

    view = session_view(proxy, "hundred")
    assert len(view["messages"]) == len(session.messages)
    assert {s["generated_by"] for s in view["summaries"]} == {"llm"}
    in_force = sorted((s for s in view["summaries"] if not s["orphaned"]), key=lambda s: s["range"][0])
    for earlier, later in itertools.pairwise(in_force):
        assert earlier["range"][1] <= later["range"][0]
    for summary in view["summaries"]:
        start_, end = summary["range"]
        assert 1 <= start_ < end <= len(view["messages"]) - PRESERVE_RECENT
        assert summary["covers"] == [m["id"] for m in view["messages"][start_:end]]
        assert summary["model"] == "summarizer"


# 4 — a broken summarizer.


@pytest.mark.parametrize("broken", ["unreachable", "empty answers"])
def test_a_broken_summarizer_falls_back_to_extractive_summaries_that_keep_the_facts(
    serve_proxy: ServeProxy, fake: FakeUpstream, broken: str
) -> None:
    fake.context_window = SMALL_WINDOW
    if broken == "unreachable":
        install_responder(fake)
        proxy, client = start(serve_proxy, fake, summarizer_base=f"http://127.0.0.1:{free_port()}/v1")
    else:
        install_responder(fake, empty_summary)
        proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "fallback")

    turns = session.run(100 if broken == "unreachable" else 60)

    fitting(fake, SMALL_WINDOW)
    assert_no_retries(turns)
    view = session_view(proxy, "fallback")
    assert view["summaries"]
    assert {s["generated_by"] for s in view["summaries"]} == {"fallback"}
    assert {s["model"] for s in view["summaries"]} == {"extractive"}
    summaries, _ = working_context(turns[-1])
    assert summaries
    for fact in FACT_TOKENS:
        assert fact in summary_text(summaries)


# 5 — switching models restores originals, and switching back reuses the summaries.


def test_a_bigger_model_gets_the_originals_back_and_the_small_one_reuses_its_summaries(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    # No pre-compaction: whether a batch written ahead in the background is done before the switch back is a
    # matter of timing, and its joining at the next crossing is pre-compaction's subject, not this test's.
    proxy, client = start(serve_proxy, fake, precompact_ratio="off")
    session = ScriptedSession(client, fake, "switch")
    while sum(turn.compacted for turn in session.turns) < 2:
        session.turn()
    session.run(2)
    before = session.turns[-1]
    summaries_before, _ = working_context(before)
    assert summaries_before

    fake.context_window = BIG_WINDOW
    big = session.turn(model="big")

    assert big.summarizer_requests == 0
    assert [comparable(m) for m in big.chat_requests[-1]] == [comparable(m) for m in big.client_messages]
    assert not any(is_summary_message(m) for m in big.chat_requests[-1])
    assert check_headers(big, BIG_BUDGET) == 0

    fake.context_window = SMALL_WINDOW
    back = session.turn(model="small")

    assert back.summarizer_requests == 0
    summaries_after, _ = working_context(back)
    assert [comparable(m) for m in summaries_after] == [comparable(m) for m in summaries_before]
    assert prefix_breaks([before, back]) == []
    assert check_headers(back, SMALL_BUDGET) == len(summaries_before)
    fitting(fake, BIG_WINDOW)
    assert_no_retries(session.turns)
    assert session_view(proxy, "switch")["model"] == "small"


# 6 — X-Context-Budget.


def test_a_budget_header_caps_the_context_is_remembered_and_can_be_forgotten(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = BIG_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "capped", model="big")

    first = session.turn(headers={"X-Context-Budget": "1500"})
    capped = [first, *session.run(14)]

    for turn in capped:
        check_headers(turn, 1500)
        assert fake.count_tokens(turn.chat_requests[-1]) <= 1500
    assert any(turn.compacted for turn in capped)
    assert_no_retries(capped)
    assert session_view(proxy, "capped")["settings"] == {"budget": 1500}
    assert session_view(proxy, "capped")["usage"]["budget"] == 1500

    released = session.turn(headers={"X-Context-Budget": "none"})

    assert check_headers(released, BIG_BUDGET) == 0
    assert [comparable(m) for m in released.chat_requests[-1]] == [comparable(m) for m in released.client_messages]
    assert "budget" not in session_view(proxy, "capped")["settings"]
    assert check_headers(session.turn(), BIG_BUDGET) == 0


# 7 — recent messages that cannot fit.


def test_a_user_message_larger_than_the_budget_is_refused_by_the_proxy(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    _proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "too-large")
    session.run(3)
    seen = len(fake.requests)
    huge = filler(seeded("huge"), 4000)
    messages = cast("list[ChatCompletionMessageParam]", [*session.messages, {"role": "user", "content": huge}])

    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="small", messages=messages, extra_headers={"X-Session-Id": "too-large"})

    assert raised.value.status_code == 400
    assert raised.value.code == "context_length_exceeded"
    found = re.search(
        r"need (\d+) tokens, but the input budget for model 'small' is (\d+) tokens", raised.value.message
    )
    assert found is not None, raised.value.message
    assert int(found.group(1)) > SMALL_BUDGET == int(found.group(2))
    assert len(fake.requests) == seen


# 8 — self-healing when the upstream counts more than the proxy.


def test_an_upstream_that_counts_more_is_healed_once_and_not_hit_again(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    enforced = 3000
    fake.context_window = enforced
    install_responder(fake)
    # Every compaction on the request path, so that the healed turn is the one that summarizes.
    proxy, client = start(serve_proxy, fake, precompact_ratio="off")
    session = ScriptedSession(client, fake, "healing")

    turns = session.run(40)

    over = [r.body for r in fake.requests if fake.count_tokens(r.body["messages"]) > enforced]
    assert len(over) == 1
    assert not is_summarizer_request(over[0])
    healed = [turn for turn in turns if len(turn.chat_requests) > len(turn.answers)]
    assert len(healed) == 1
    assert healed[0].chat_requests[0] == over[0]["messages"]
    assert healed[0].compacted
    shrunk = int(healed[0].headers["x-context-budget"])
    assert shrunk < enforced
    later = turns[healed[0].number :]
    assert any(turn.compacted for turn in later)
    for turn in later:
        check_headers(turn, shrunk)
    fitting_after = [r for r in fake.requests if r.body is not over[0]]
    assert all(fake.count_tokens(r.body["messages"]) <= enforced for r in fitting_after)
    # The inspection view reports the budget the requests got, learned correction included.
    view = httpx.get(f"{proxy.url}/sessions/{turns[-1].headers['x-session-id']}").json()
    assert view["usage"]["budget"] == shrunk


def agent_tools(count: int, words: int) -> list[dict[str, Any]]:
    """An agent's tool list: `count` functions, each described in about `words` words."""
    rng = seeded("tools")
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{index}",
                "description": filler(rng, words),
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": filler(rng, words // 4)}},
                    "required": ["path"],
                },
            },
        }
        for index in range(count)
    ]


def test_an_agents_tool_definitions_count_against_the_window(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    # ~1,400 tokens of tools on a 4,096-token model that counts them (as OpenAI and Anthropic do): a budget of
    # messages only would send ~1,400 tokens too many at the first crossing and learn a tokenizer ratio that is
    # really the tools' size.
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    tools = agent_tools(8, 120)
    session = ScriptedSession(client, fake, "agent-tools", tools=tools, tool_every=3)

    turns = session.run(30)

    assert fake.rejected == []
    assert_no_retries(turns)
    assert any(turn.compacted for turn in turns)
    for request in fake.requests:
        body = request.body
        assert fake.prompt_tokens(body["messages"], body.get("tools")) + (body.get("max_tokens") or 0) <= SMALL_WINDOW
    definitions = fake.prompt_tokens([], tools) - fake.prompt_tokens([])
    assert definitions > 1_000
    budget = int(turns[-1].headers["x-context-budget"])
    assert budget == SMALL_WINDOW - MAX_OUTPUT - math.ceil(0.05 * SMALL_WINDOW)  # no ratio learned
    for turn in turns:
        check_headers(turn, budget)
        sent = turn.chat_requests[-1]
        # What the proxy reports sending is the messages and the tools, by its count (within the margin).
        assert int(turn.headers["x-context-tokens"]) >= fake.prompt_tokens(sent, tools) * 0.95
    # The session view plans the next request with the tools its last one sent.
    view = session_view(proxy, turns[-1].headers["x-session-id"])
    assert view["usage"]["budget"] == budget
    assert view["usage"]["history_tokens"] >= definitions + fake.prompt_tokens(session.messages) * 0.95


# 9 — X-Context-Mode: off.


def test_mode_off_passes_the_messages_through_and_still_stores_them(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "off")
    off = {"X-Context-Mode": "off"}
    turns = session.run(12, headers=off)
    for turn in turns:
        assert [comparable(m) for m in turn.chat_requests[-1]] == [comparable(m) for m in turn.client_messages]
    seen = len(fake.requests)
    over = filler(seeded("over"), 2500)
    messages = [*session.messages, {"role": "user", "content": over}]

    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="small",
            messages=cast("list[ChatCompletionMessageParam]", messages),
            extra_headers={"X-Session-Id": "off", **off},
        )

    assert raised.value.code == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in raised.value.message
    assert len(fake.requests) == seen + 1
    assert [comparable(m) for m in fake.requests[-1].body["messages"]] == [comparable(m) for m in messages]
    stored = session_view(proxy, "off")["messages"]
    assert [(m["role"], m["content"]) for m in stored] == [(m["role"], m["content"]) for m in messages]
    assert not any(is_summarizer_request(r.body) for r in fake.requests)

    compacted = client.chat.completions.with_raw_response.create(
        model="small",
        messages=cast("list[ChatCompletionMessageParam]", messages),
        extra_headers={"X-Session-Id": "off"},
    )
    assert int(compacted.headers["x-context-summaries"]) > 0
    assert int(compacted.headers["x-context-tokens"]) <= SMALL_BUDGET


# 10 — the summarize endpoint, the session view, and tool calls.


def test_summarize_endpoint_writes_a_summary_the_session_view_shows(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "forced", stream_every=2)
    turns = session.run(8)
    assert not any(turn.compacted for turn in turns)
    for turn in turns:
        assert check_headers(turn, SMALL_BUDGET) == 0
    seen = len(fake.requests)

    response = httpx.post(f"{proxy.url}/sessions/forced/summarize", timeout=30)

    assert response.status_code == 200, response.text
    created = response.json()
    assert created["object"] == "summary"
    assert len(fake.requests) == seen + 1
    assert is_summarizer_request(fake.requests[-1].body)
    view = session_view(proxy, "forced")
    [summary] = view["summaries"]
    assert summary["id"] == created["id"]
    start_, end = summary["range"]
    assert start_ == 1
    assert start_ < end <= len(view["messages"]) - PRESERVE_RECENT
    assert summary["covers"] == [m["id"] for m in view["messages"][start_:end]]
    assert 0 < summary["tokens"] < summary["original_tokens"]
    assert summary["ratio"] == round(summary["tokens"] / summary["original_tokens"], 3)
    assert (summary["model"], summary["generated_by"]) == ("summarizer", "llm")
    assert FACT_TOKENS[0] in summary["content"]
    usage = view["usage"]
    assert usage["budget"] == SMALL_BUDGET
    assert usage["percent"] == round(100 * usage["context_tokens"] / SMALL_BUDGET, 1)
    assert usage["severity"] == "green"
    assert httpx.post(f"{proxy.url}/sessions/nobody/summarize", timeout=10).status_code == 404


def test_a_nearly_full_session_is_shown_red(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "full")
    while int(session.turn().headers["x-context-tokens"]) <= 0.9 * SMALL_BUDGET:
        pass
    usage = session_view(proxy, "full")["usage"]
    assert usage["percent"] > 90
    assert usage["severity"] == "red"


def test_tool_calls_and_their_results_are_never_separated(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "tools", tool_every=2, stream_every=3)

    turns = session.run(60)

    fitting(fake, SMALL_WINDOW)
    assert_no_retries(turns)
    tool_turns = [turn for turn in turns if turn.answers[0].get("tool_calls")]
    assert len(tool_turns) == 30
    assert any(turn.number % 3 == 0 for turn in tool_turns)
    assert all(len(turn.chat_requests) == 2 for turn in tool_turns)
    assert sum(turn.compacted for turn in turns) >= 3
    assert set(prefix_breaks(turns)) <= set(shrinking(turns))
    for turn in turns:
        working_context(turn)
    view = session_view(proxy, "tools")
    roles = [m["role"] for m in view["messages"]]
    assert roles.count("tool") == 30 * TOOL_CALLS_PER_TURN
    assert view["summaries"]
    for summary in view["summaries"]:
        start_, end = summary["range"]
        assert roles[start_] != "tool"
        assert roles[end] != "tool"
        assert roles[end - 1] != "assistant" or "tool_calls" not in view["messages"][end - 1]


def test_a_long_history_moved_to_the_small_model_is_summarized_within_the_summarizers_window(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = BIG_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake, max_summarizer_calls=20)  # every summary by the model
    session = ScriptedSession(client, fake, "moved", model="big")
    session.run(60)
    seen = len(fake.requests)

    fake.context_window = SMALL_WINDOW
    moved = session.turn(model="small")

    assert moved.summarizer_requests >= 2
    fitting(fake, BIG_WINDOW)
    for request in fake.requests[seen:]:
        body = request.body
        assert fake.count_tokens(body["messages"]) + (body.get("max_tokens") or 0) <= SMALL_WINDOW
    view = session_view(proxy, "moved")
    assert {s["generated_by"] for s in view["summaries"]} == {"llm"}
    summaries, _ = working_context(moved)
    for fact in FACT_TOKENS:
        assert fact in summary_text(summaries)


# Issue 42 — never worse than truncation.


def test_a_long_chat_stays_near_its_budget_with_the_recent_turns_verbatim(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    # A chat of small turns on the 4k model, the summarizer down (extractive summaries): after the first crossing
    # every request sends the summaries and a verbatim suffix of the history that together fill the budget but
    # for one crossing's headroom (`headroom_turns` requests' growth), where compacting down to `compact_to`
    # left almost half of it empty and summarized turns a sliding window would have kept.
    fake.context_window = SMALL_WINDOW
    rng = random.Random(42)
    fake.responder = lambda body: Reply(content=filler(rng, rng.randint(10, 40)))
    _, client = start(serve_proxy, fake, summarizer_base=f"http://127.0.0.1:{free_port()}/v1")
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    growth = headroom = 0
    filled: list[int] = []
    for turn in range(120):
        history.append({"role": "user", "content": f"Turn {turn}. {filler(rng, rng.randint(10, 40))}"})
        raw = client.chat.completions.with_raw_response.create(
            model="small",
            messages=cast("list[ChatCompletionMessageParam]", history),
            extra_headers={"X-Session-Id": "near-full"},
        )
        answer = raw.parse().choices[0].message.content or ""
        sent = [r.body for r in fake.requests if not is_summarizer_request(r.body)][-1]["messages"]
        fake.requests.clear()
        tokens = int(raw.headers["x-context-tokens"])
        assert tokens <= SMALL_BUDGET
        history.append({"role": "assistant", "content": answer})
        growth = max(growth, count_message(history[-1]) + count_message(history[-2]))
        if any(is_summary_message(message) for message in sent):
            shown = recall_taken_out(sent[1:])
            originals = [m for m in shown if not is_summary_message(m) and not is_acknowledgement(m)]
            assert [comparable(m) for m in originals] == [comparable(m) for m in history[-len(originals) - 1 : -1]]
            headroom = DEFAULT_HEADROOM_TURNS * growth
            filled.append(tokens)
            assert tokens >= SMALL_BUDGET - headroom - growth
    assert len(filled) > 40
    # The room the crossing left is filled, for each request only, with hidden turns (recall's fill): a chat's turn
    # is its one request, so what is left is the part of a turn that did not fit.
    assert sum(filled) / len(filled) > SMALL_BUDGET - growth
