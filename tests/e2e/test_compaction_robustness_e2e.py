"""Issue 11, items 5–7, through the served proxy, the strict fake upstream and the official OpenAI SDK.

- 5: a summarizer whose summaries are longer than what they replace, and one too slow to wait for: the turns
  still fit, every stored summary shrinks its range, and no turn waits for more than the per-request allowance
  (`context.max_summarizer_calls`, `context.summarizer_deadline_s`).
- 6: an upstream that names every tool call `call_0` (as some local servers do): the conversation compacts
  like any other instead of failing on every turn.
- 7: a fake upstream that refuses what strict chat templates refuse (a system message after the first turn,
  an assistant turn first, two user or assistant turns in a row) accepts every compacted working context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.compaction.summary_text import ACKNOWLEDGEMENT
from tests.conftest import ServeProxy
from tests.e2e.test_compaction_e2e import (
    BIG_WINDOW,
    SMALL_BUDGET,
    SMALL_WINDOW,
    assert_no_retries,
    check_headers,
    fitting,
    session_view,
    start,
    summary_text,
    working_context,
)
from tests.support.fake_upstream import FakeUpstream, Reply, content_text, role_order_error
from tests.support.scripted_session import (
    FACT_TOKENS,
    ScriptedSession,
    chat_answer,
    fact_keeping_summary,
    install_responder,
    is_summarizer_request,
    is_summary_message,
    prefix_breaks,
    shrinking,
)

SLOW_SUMMARIZER_S = 15.0
"""Longer than the test's deadline, shorter than the proxy's upstream timeout (10 s in tests) would allow for."""


def rambling_summary(body: Mapping[str, Any]) -> Reply:
    """A weak summarizer: it repeats the transcript it was given, so its summary is longer than the original."""
    transcript = content_text(body["messages"][-1].get("content"))
    return Reply(content=f"{transcript}\n{transcript}")


def reusing_call_ids(body: dict[str, Any]) -> Reply:
    """The chat model of `scripted_session`, except that its tool calls are always `call_0`, `call_1`, …"""
    if is_summarizer_request(body):
        return fact_keeping_summary(body)
    reply = chat_answer(body)
    for index, call in enumerate(reply.tool_calls or ()):
        call["id"] = f"call_{index}"
    return reply


# 5 — a weak summarizer.


def test_summaries_longer_than_what_they_replace_are_not_used(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake, rambling_summary)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "rambling")

    turns = session.run(40)

    fitting(fake, SMALL_WINDOW)
    assert_no_retries(turns)
    assert any(turn.compacted for turn in turns)
    for turn in turns:
        check_headers(turn, SMALL_BUDGET)
    view = session_view(proxy, "rambling")
    assert view["summaries"]
    for summary in view["summaries"]:
        assert summary["tokens"] < summary["original_tokens"]
        assert summary["ratio"] < 1
        assert (summary["generated_by"], summary["model"]) == ("fallback", "extractive")
    summaries, _ = working_context(turns[-1])
    for fact in FACT_TOKENS:
        assert fact in summary_text(summaries)


def test_one_turn_waits_for_at_most_max_summarizer_calls(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    fake.context_window = BIG_WINDOW
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)  # the default allowance: 2 calls
    session = ScriptedSession(client, fake, "moved", model="big")
    session.run(60)

    fake.context_window = SMALL_WINDOW
    moved = session.turn(model="small")
    later = session.run(10, model="small")

    assert moved.summarizer_requests == 2
    assert all(turn.summarizer_requests <= 2 for turn in later)
    for turn in [moved, *later]:
        check_headers(turn, SMALL_BUDGET)
        working_context(turn)
    fitting(fake, BIG_WINDOW)
    assert_no_retries([moved, *later])
    generated = [s["generated_by"] for s in session_view(proxy, "moved")["summaries"]]
    assert generated.count("llm") >= 2
    assert "fallback" in generated


def test_a_summarizer_slower_than_the_deadline_is_not_waited_for(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    fake.delay = lambda body: SLOW_SUMMARIZER_S if is_summarizer_request(body) else 0.0
    proxy, client = start(serve_proxy, fake, summarizer_deadline_s=1)
    session = ScriptedSession(client, fake, "slow")

    turns = session.run(40)

    compacted = [turn for turn in turns if turn.compacted]
    assert compacted
    assert max(turn.seconds for turn in turns) < 5
    assert all(turn.summarizer_requests == 1 for turn in compacted)  # after the deadline, only the fallback
    fitting(fake, SMALL_WINDOW)
    assert {s["generated_by"] for s in session_view(proxy, "slow")["summaries"]} == {"fallback"}


# 6 — an upstream that reuses tool-call ids.


def test_an_upstream_that_reuses_tool_call_ids_keeps_the_conversation_going(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    fake.responder = reusing_call_ids
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "reused", tool_every=2, stream_every=3)

    turns = session.run(40)

    assert {m["tool_call_id"] for m in session.messages if m["role"] == "tool"} == {"call_0", "call_1"}
    assert sum(turn.compacted for turn in turns) >= 2
    fitting(fake, SMALL_WINDOW)
    assert_no_retries(turns)
    assert set(prefix_breaks(turns)) <= set(shrinking(turns))
    for turn in turns:
        check_headers(turn, SMALL_BUDGET)
        working_context(turn)
    view = session_view(proxy, "reused")
    roles = [m["role"] for m in view["messages"]]
    for summary in view["summaries"]:
        start_, end = summary["range"]
        assert roles[start_] != "tool"
        assert roles[end] != "tool"


# 7 — role order after compaction.


def test_every_compacted_context_is_accepted_by_a_strict_chat_template(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    fake.strict_roles = True
    install_responder(fake)
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "strict", tool_every=3, stream_every=4)

    turns = session.run(60)

    assert sum(turn.compacted for turn in turns) >= 3
    fitting(fake, SMALL_WINDOW)
    assert_no_retries(turns)
    assert set(prefix_breaks(turns)) <= set(shrinking(turns))
    sent = [request for turn in turns for request in turn.chat_requests]
    for messages in sent:
        assert role_order_error(messages) is None
        summaries = [m for m in messages if is_summary_message(m)]
        assert all(m["role"] == "user" for m in summaries)
    acknowledged = [m for messages in sent for m in messages if m.get("content") == ACKNOWLEDGEMENT]
    assert acknowledged
    assert all(m["role"] == "assistant" for m in acknowledged)
    for turn in turns:
        working_context(turn)
    assert session_view(proxy, "strict")["summaries"]
