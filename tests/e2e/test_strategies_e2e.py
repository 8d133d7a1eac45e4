"""Compaction strategies, recall and events through the served proxy, with the official SDKs as clients.

The proxy runs in a real uvicorn in front of the strict fake upstream (which checks tool pairing and role order);
a low `X-Context-Budget` makes short conversations compact.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from proxy.compaction.recall import RECALL_HEADER
from proxy.compaction.stubs import MARKER_PREFIX, STUB_PREFIX
from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer

TIMEOUT = 20
PROSE = "the proxy keeps every message forever and sends a working context that fits the window of the model"


def client(proxy: ProxyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT)


def chat(proxy: ProxyServer, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
    """One chat request; the raw response (headers and status) is what these tests read."""
    sdk: list[ChatCompletionMessageParam] = messages  # type: ignore[assignment]  # plain dicts, as clients send
    with client(proxy) as sdk_client:
        raw = sdk_client.chat.completions.with_raw_response.create(model="fake", messages=sdk, extra_headers=headers)
        return raw.http_response


def prose_turns(turns: int, facts: dict[int, str] | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        fact = f" Note {facts[turn]} for later." if facts and turn in facts else ""
        messages.append({"role": "user", "content": f"Turn {turn}: {PROSE}.{fact}"})
        messages.append({"role": "assistant", "content": f"Answer {turn}: {PROSE}."})
    return messages


def stored_counts(proxy: ProxyServer) -> tuple[int, int]:
    with sqlite3.connect(proxy.config.store.path) as db:
        messages = db.execute("SELECT count(*) FROM messages").fetchone()[0]
        sessions = db.execute("SELECT count(*) FROM sessions").fetchone()[0]
    return messages, sessions


def events(proxy: ProxyServer, session: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{proxy.url}/sessions/{session}/events?limit=200", timeout=TIMEOUT)
    response.raise_for_status()
    listed: list[dict[str, Any]] = response.json()["events"]
    return listed


def is_summarizer(body: dict[str, Any]) -> bool:
    return str(body["messages"][0].get("content")).startswith("You summarize")


def last_prompt(fake: FakeUpstream) -> list[dict[str, Any]]:
    main = [r.body for r in fake.requests if not is_summarizer(r.body)]
    messages: list[dict[str, Any]] = main[-1]["messages"]
    return messages


def summarizer_requests(fake: FakeUpstream) -> int:
    return sum(is_summarizer(r.body) for r in fake.requests)


@pytest.mark.parametrize("value", ["magic", "summarize,summarize", "", "tool-results,,summarize", "x" * 300])
def test_an_invalid_strategy_header_is_a_400_on_every_door_and_stores_nothing(
    serve_proxy: ServeProxy, fake: FakeUpstream, value: str
) -> None:
    proxy = serve_proxy()
    with pytest.raises(openai.BadRequestError) as chat_error:
        chat(proxy, prose_turns(1), **{"X-Context-Strategy": value})
    assert chat_error.value.param == "X-Context-Strategy"  # type: ignore[attr-defined]

    with client(proxy) as sdk_client, pytest.raises(openai.BadRequestError) as responses_error:
        sdk_client.responses.create(model="fake", input="hi", extra_headers={"X-Context-Strategy": value})
    assert "X-Context-Strategy" in str(responses_error.value)

    messages = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=TIMEOUT)
    with messages, pytest.raises(anthropic.BadRequestError) as messages_error:
        messages.messages.create(
            model="fake",
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Context-Strategy": value},
        )
    assert messages_error.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert stored_counts(proxy) == (0, 0)
    assert fake.requests == []


def test_a_sliding_window_session_omits_old_turns_without_a_summarizer_and_keeps_its_choice(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = serve_proxy()
    messages = prose_turns(24)
    messages.append({"role": "user", "content": "And now?"})
    first = chat(proxy, messages, **{"X-Session-Id": "window", "X-Context-Strategy": "sliding-window"})
    assert first.status_code == 200
    messages += [{"role": "assistant", "content": "Now this."}, {"role": "user", "content": "And then?"}]
    later = chat(proxy, messages, **{"X-Session-Id": "window", "X-Context-Budget": "600"})  # no strategy header

    assert later.status_code == 200
    assert summarizer_requests(fake) == 0
    prompt = last_prompt(fake)
    markers = [m for m in prompt if str(m.get("content")).startswith(MARKER_PREFIX)]
    assert len(markers) == 1
    assert int(later.headers["x-context-tokens"]) <= 600
    assert prompt[-1] == messages[-1]
    written = [e for e in events(proxy, "window") if e["event"] == "complete"]
    assert written
    assert {e["strategy"] for e in written} == {"sliding-window"}


def test_old_tool_outputs_reach_the_strict_upstream_as_stubs_paired_with_their_calls(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = serve_proxy()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(6):
        call = f"call_{turn}"
        arguments = json.dumps({"command": f"pytest tests/test_{turn}.py"})
        output = "\n".join(f"tests/test_{turn}.py::test_{n} PASSED {PROSE}" for n in range(30))
        messages += [
            {"role": "user", "content": f"Run the tests of module {turn}."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "shell", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call, "content": output + f"\n40 passed in 0.{turn}s"},
            {"role": "assistant", "content": f"Module {turn} passes."},
        ]  # fmt: skip
    messages.append({"role": "user", "content": "Summarize the state."})
    response = chat(proxy, messages, **{"X-Session-Id": "agent", "X-Context-Budget": "4000"})

    assert response.status_code == 200
    assert summarizer_requests(fake) == 0
    prompt = last_prompt(fake)
    stubs = [m for m in prompt if str(m.get("content")).startswith(STUB_PREFIX)]
    assert stubs
    assert "shell(command=pytest tests/test_0.py)" in stubs[0]["content"]
    assert "40 passed" in stubs[0]["content"]
    assert [m.get("tool_call_id") for m in prompt if m["role"] == "tool"] == [f"call_{turn}" for turn in range(6)]
    with sqlite3.connect(proxy.config.store.path) as db:
        outputs = [row[0] for row in db.execute("SELECT body FROM messages WHERE role = 'tool'")]
    assert len(outputs) == 6
    assert all(STUB_PREFIX not in body for body in outputs)  # the history keeps the originals


def test_a_question_about_a_fact_only_in_compacted_history_recalls_it(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = serve_proxy(context={"strategies": ["summarize"]})
    messages = prose_turns(30, facts={1: "DEPLOY_REGION=eu-west-3"})
    messages.append({"role": "user", "content": "Which DEPLOY_REGION did we settle on?"})
    response = chat(proxy, messages, **{"X-Session-Id": "recall", "X-Context-Budget": "900"})

    assert response.status_code == 200
    assert int(response.headers["x-context-summaries"]) >= 1
    prompt = last_prompt(fake)
    recalled = [m for m in prompt if str(m.get("content")).startswith(RECALL_HEADER)]
    if "DEPLOY_REGION=eu-west-3" in json.dumps([m for m in prompt if m not in recalled]):
        pytest.fail("the summary kept the fact: this test needs a summary that drops it")
    assert int(response.headers["x-context-recalled"]) >= 1
    assert len(recalled) == 1
    assert "DEPLOY_REGION=eu-west-3" in recalled[0]["content"]
    assert prompt[-1] == messages[-1]
    assert int(response.headers["x-context-tokens"]) <= 900
