"""A client's own compaction answered by the proxy (Claude Code's /compact and auto-compact, with the official
`anthropic` SDK against the served proxy and the strict fake upstream): the summary request gets a summary made
from what the proxy holds, with no model call; when the client sends that summary back in place of its turns,
the upstream gets the whole stored conversation again and the session keeps every original. With
`context.client_compaction: false` the request goes to the model like any other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer

SESSION = {"X-Claude-Code-Session-Id": "cc-session"}
COMPACT_SYSTEM = "You are a helpful AI assistant tasked with summarizing conversations."
COMPACT_PROMPT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Do NOT use Read, Bash, Grep, Glob, Edit, Write, "
    "or ANY other tool.\n\nYour task is to create a detailed summary of the conversation so far, paying close "
    "attention to the user's explicit requests and your previous actions.\n\nREMINDER: Do NOT call any tools. "
    "Respond with plain text only — an <analysis> block followed by a <summary> block."
)
CONTINUED = (
    "This session is being continued from a previous conversation that ran out of context. The summary below "
    "covers the earlier portion of the conversation.\n\nSummary:\n"
)


def client(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=20)


@pytest.fixture
def sdk(proxy: ProxyServer) -> Iterator[anthropic.Anthropic]:
    with client(proxy) as sdk:
        yield sdk


def converse(sdk: anthropic.Anthropic, turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for turn in range(turns):
        history.append({"role": "user", "content": f"turn {turn}: remember FACT_{turn}"})
        answer = sdk.messages.create(
            model="fake", max_tokens=100, system="You are a coding agent.", messages=history, extra_headers=SESSION
        )
        history.append({"role": "assistant", "content": answer.content[0].text})  # type: ignore[union-attr]
    return history


def compact(sdk: anthropic.Anthropic, history: list[dict[str, Any]]) -> str:
    """Claude Code's summary request, as a stream (it streams it)."""
    with sdk.messages.stream(
        model="fake",
        max_tokens=20000,
        system=COMPACT_SYSTEM,
        messages=[*history, {"role": "user", "content": COMPACT_PROMPT}],
        extra_headers=SESSION,
    ) as stream:
        return stream.get_final_text()


def test_a_compact_is_answered_without_a_model_call_and_its_summary_brings_the_conversation_back(
    sdk: anthropic.Anthropic, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    history = converse(sdk, 3)
    calls = len(fake.requests)
    text = compact(sdk, history)
    assert len(fake.requests) == calls  # no model call
    assert "<summary>" in text
    assert "FACT_2" in text  # the extractive summary of turns no span covers
    summary = text.split("<summary>", 1)[1].split("</summary>", 1)[0].strip()
    later = sdk.messages.create(
        model="fake",
        max_tokens=100,
        system="You are a coding agent.",
        messages=[
            {
                "role": "user",
                "content": [  # as Claude Code sends it: the summary and the new prompt, blocks of one message
                    {"type": "text", "text": CONTINUED + summary},
                    {"type": "text", "text": "what was FACT_0?"},
                ],
            }
        ],
        extra_headers=SESSION,
    )
    assert later.stop_reason == "end_turn"
    sent = fake.requests[-1].body["messages"]
    texts = [message.get("content") for message in sent]
    assert texts[0] == "You are a coding agent."
    assert texts[1] == "turn 0: remember FACT_0"  # the stored conversation, not the summary
    assert not any(CONTINUED in str(text) for text in texts)
    assert texts[-1] == "what was FACT_0?"
    session = httpx.get(f"{proxy.url}/sessions/cc-session", timeout=10).json()
    users = [m["content"] for m in session["messages"] if m["role"] == "user"]
    assert users[:3] == [f"turn {t}: remember FACT_{t}" for t in range(3)]
    assert not any(COMPACT_PROMPT in str(user) for user in users)


def test_with_client_compaction_off_the_summary_request_goes_to_the_model(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = serve_proxy(context={"client_compaction": False})
    with client(proxy) as sdk:
        history = converse(sdk, 1)
        calls = len(fake.requests)
        compact(sdk, history)
    assert len(fake.requests) == calls + 1
