"""A client that compacts by a summary request of its own, its conversation written out as text (Pi, OpenCode),
through the served proxy with the `openai` SDK and the strict fake: the request is answered at once with no model
call, for the stored session the text comes from; when the client sends the summary back with the turns it kept
after it, the upstream gets the stored conversation again, the kept turns once, and it all stays one session."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import openai

from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.proxy_server import ProxyServer

SYSTEM = "You are a coding agent."
PI_SYSTEM = (  # @earendil-works/pi-coding-agent 0.74.2, SUMMARIZATION_SYSTEM_PROMPT
    "You are a context summarization assistant. Your task is to read a conversation between a user and an AI coding "
    "assistant, then produce a structured summary following the exact format specified."
)
PI_PROMPT = (  # its SUMMARIZATION_PROMPT's opening
    "The messages above are a conversation to summarize. Create a structured context checkpoint summary that "
    "another LLM will use to continue the work."
)
PI_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
OPENCODE_PROMPT = (  # opencode-ai 1.18.33, SessionCompaction
    "Create a new anchored summary from the conversation history in the <conversation> tags above so another coding "
    "agent can continue the work."
)


def converse(client: openai.OpenAI, turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"turn {turn}: remember FACT_{turn}"})
        answer = client.chat.completions.create(model="fake", messages=history)  # type: ignore[arg-type]
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    return history


def serialized(history: list[dict[str, Any]], joiner: str) -> str:
    marks = {"user": "[User]", "assistant": "[Assistant]"}
    return joiner.join(f"{marks[m['role']]}: {m['content']}" for m in history if m["role"] in marks)


def sessions(proxy: ProxyServer) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = httpx.get(f"{proxy.url}/sessions", timeout=10).json()["data"]
    return data


def test_pis_summary_request_is_answered_from_the_store_and_its_summary_brings_the_session_back(
    client: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    history = converse(client, 4)
    calls = len(fake.requests)
    summarized = history[:5]  # turns 0 and 1; Pi keeps turns 2 and 3 after its summary
    text = f"<conversation>\n{serialized(summarized, chr(10) * 2)}\n</conversation>\n\n{PI_PROMPT}"
    answer = client.chat.completions.create(
        model="fake",
        messages=[
            {"role": "system", "content": PI_SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ],
    )
    assert len(fake.requests) == calls  # no model call
    summary = answer.choices[0].message.content or ""
    assert "ctxinf1." in summary
    kept = history[5:]
    later = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": f"{PI_PREFIX}{summary}\n</summary>"}]},
        *kept,
        {"role": "user", "content": "what was FACT_0?"},
    ]
    client.chat.completions.create(model="fake", messages=later)  # type: ignore[arg-type]
    sent = [m.get("content") for m in fake.requests[-1].body["messages"]]
    assert sent == [*(m["content"] for m in history), "what was FACT_0?"]  # every turn once, no summary
    assert len(sessions(proxy)) == 1


def test_opencodes_summary_kept_as_an_answer_brings_the_session_back(
    client: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    history = converse(client, 3)
    calls = len(fake.requests)
    text = (
        f"Here is the conversation so far:\n<conversation>\n{serialized(history[:3], chr(10))}\n</conversation>\n"
        f"{OPENCODE_PROMPT}"
    )
    answer = client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    )
    assert len(fake.requests) == calls
    summary = answer.choices[0].message.content or ""
    later = [  # OpenCode: its compaction turn, the summary as that turn's answer, the kept tail, a continue prompt
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": summary},
        *history[3:],
        {"role": "user", "content": "Continue if you have next steps."},
    ]
    client.chat.completions.create(model="fake", messages=later)  # type: ignore[arg-type]
    sent = [m.get("content") for m in fake.requests[-1].body["messages"]]
    assert sent == [*(m["content"] for m in history), "Continue if you have next steps."]
    assert len(sessions(proxy)) == 1


def test_a_serialized_summary_of_a_conversation_the_proxy_never_saw_goes_to_the_model(
    client: openai.OpenAI, fake: FakeUpstream
) -> None:
    text = f"<conversation>\n[User]: hello there\n\n[Assistant]: hi\n</conversation>\n\n{PI_PROMPT}"
    client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": text}]
    )
    assert len(fake.requests) == 1


PI_UPDATE = (  # its UPDATE_SUMMARIZATION_PROMPT's opening
    "The messages above are NEW conversation messages to incorporate into the existing summary provided in "
    "<previous-summary> tags."
)


def test_pi_asking_again_with_nothing_new_is_answered_for_the_session_its_summary_names(
    client: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    """Pi compacts again when the window it was told about is still full, with no turn to summarize: an empty
    `<conversation>` and its previous summary (the proxy's, with its reference)."""
    history = converse(client, 3)
    first = f"<conversation>\n{serialized(history[:3], chr(10) * 2)}\n</conversation>\n\n{PI_PROMPT}"
    summary = client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": first}]
    )
    calls = len(fake.requests)
    previous = summary.choices[0].message.content
    again = f"<conversation>\n\n</conversation>\n\n<previous-summary>\n{previous}\n</previous-summary>\n\n{PI_UPDATE}"
    answer = client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": again}]
    )
    assert len(fake.requests) == calls
    assert "ctxinf1." in (answer.choices[0].message.content or "")
    assert len(sessions(proxy)) == 1


def other_converse(client: openai.OpenAI, topic: str, turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"{topic} {turn}: keep {topic.upper()}_{turn}"})
        answer = client.chat.completions.create(model="fake", messages=history)  # type: ignore[arg-type]
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    return history


def test_a_summary_request_showing_no_user_turn_is_answered_for_the_session_its_turns_come_from(
    client: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    """A tenant with two sessions; the summary request shows only an answer of the older one (Pi's summary of a
    turn's prefix, its user message kept): it is answered for that session, not the most recent."""
    fake.responder = lambda body: Reply(content=f"noted: {content_text(body['messages'][-1]['content'])[::-1]}")
    older = other_converse(client, "apples", 3)
    other_converse(client, "pears", 3)
    calls = len(fake.requests)
    text = f"<conversation>\n[Assistant]: {older[-1]['content']}\n</conversation>\n\n{PI_PROMPT}"
    answer = client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": text}]
    )
    assert len(fake.requests) == calls  # answered by the proxy
    summary = answer.choices[0].message.content or ""
    back = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{PI_PREFIX}{summary}\n</summary>"},
        {"role": "user", "content": "what did we keep?"},
    ]
    client.chat.completions.create(model="fake", messages=back)  # type: ignore[arg-type]
    sent = [m.get("content") for m in fake.requests[-1].body["messages"]]
    assert sent == [*(m["content"] for m in older), "what did we keep?"]


def test_a_summary_request_that_names_no_session_goes_to_the_model_when_the_tenant_has_several(
    client: openai.OpenAI, fake: FakeUpstream
) -> None:
    """Nothing in it tells which of the tenant's sessions it summarizes: answering for the most recent could hand
    the client another conversation's reference, so the model answers it."""
    other_converse(client, "apples", 2)
    other_converse(client, "pears", 2)
    calls = len(fake.requests)
    text = f"<conversation>\n\n</conversation>\n\n{PI_PROMPT}"
    client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": text}]
    )
    assert len(fake.requests) == calls + 1


def test_the_stored_turns_a_summary_brings_back_are_sent_as_the_client_last_sent_them(
    client: openai.OpenAI, fake: FakeUpstream
) -> None:
    """A client that re-sends the model's tool calls in a form of its own (Pi: `"content": null`, the arguments
    re-encoded) and summarizes every turn: the turns its summary stands for went upstream in that form while it
    still sent them, so they must keep it when they come from the store, or each summary breaks the cached
    prompt (Pi over chat cached 72 % of its input over 100 turns)."""
    fake.responder = lambda body: (
        Reply(content="done")
        if body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"id": f"call_{len(body['messages'])}", "type": "function",
                                "function": {"name": "bash", "arguments": '{"command": "ls"}'}}])
    )  # fmt: skip
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    summary = None
    for turn in range(4):
        history.append({"role": "user", "content": f"turn {turn}: run ls"})
        start = len(history) - 1  # the turn's own messages follow the summary
        while True:
            sent = history if summary is None else [history[0], *summary, *history[start:]]
            answer = client.chat.completions.create(model="fake", messages=sent, tools=tools)  # type: ignore[arg-type]
            message = answer.choices[0].message
            if not message.tool_calls:
                history.append({"role": "assistant", "content": message.content})
                break
            call = message.tool_calls[0]
            history.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
            ]})  # fmt: skip
            history.append({"role": "tool", "tool_call_id": call.id, "content": f"file{turn}.txt"})
        conversation = "\n\n".join(
            f"[User]: {m['content']}" if m["role"] == "user" else f"[Assistant]: {m['content']}"
            for m in history[1:]
            if m["role"] in ("user", "assistant") and m.get("content")
        )
        text = f"<conversation>\n{conversation}\n</conversation>\n\n{PI_PROMPT}"
        asked = client.chat.completions.create(
            model="fake", messages=[{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": text}]
        )
        summary = [{"role": "user", "content": f"{PI_PREFIX}{asked.choices[0].message.content}\n</summary>"}]
    upstream = [request.body["messages"] for request in fake.requests]
    for before, after in itertools.pairwise(upstream):
        assert after[: len(before)] == before
