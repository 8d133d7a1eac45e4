"""Cost you can see, through the served proxy on the caching fake: per step and per session in
`GET /sessions/{id}` (`cost`), `/metrics`, and the X-Context-Cached-Tokens header of non-stream answers."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import openai

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import ScriptedSession, install_responder, is_summarizer_request

WINDOW = 32768
COMMON = {"model": "openai/fake-model", "api_key": "sk-x", "max_output": 512, "context_window": WINDOW}


def start(serve_proxy: ServeProxy, fake: FakeUpstream) -> tuple[ProxyServer, openai.OpenAI]:
    fake.context_window = WINDOW
    install_responder(fake)
    models = [
        {"name": "big", **COMMON, "api_base": fake.url},
        {"name": "summarizer", **COMMON, "model": "openai/fake-summarizer", "api_base": fake.url},
    ]
    proxy = serve_proxy(models=models, context={"summarizer_model": "summarizer"})
    return proxy, openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30)


def cost_of(proxy: ProxyServer, session_id: str) -> dict[str, Any]:
    response = httpx.get(f"{proxy.url}/sessions/{session_id}", timeout=10)
    assert response.status_code == 200, response.text
    cost: dict[str, Any] = response.json()["cost"]
    return cost


def metric(proxy: ProxyServer, name: str, labels: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    found = re.search(rf"^{name}_total\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_cached_tokens_per_step_per_session_in_metrics_and_header(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "cost", model="big", stream_every=3)
    session.messages[0]["content"] = "You are a terse engineering assistant. " * 200  # a prefix OpenAI caches
    turns = session.run(9)

    cost = cost_of(proxy, "cost")
    steps = cost["turns"]
    assert len(steps) == cost["steps"] == sum(len(turn.answers) for turn in turns)
    assert cost["cached_tokens"] == sum(step["cached_tokens"] for step in steps) > 0
    assert cost["sent_tokens"] == sum(step["sent_tokens"] for step in steps)
    assert 0 < cost["cached_share"] < 1
    assert steps[0]["cached_tokens"] == 0  # nothing was sent before the first request
    for step in steps:
        assert step["sent_tokens"] > 0  # streamed steps too: the upstream is asked for their usage
        assert 0 <= step["cached_tokens"] <= step["sent_tokens"]
        assert step["requested_tokens"] >= step["counted_tokens"] > 0
        assert (step["cached_tokens"] - 1024) % 128 == 0 or step["cached_tokens"] == 0  # OpenAI's blocks
    streamed = [turn for turn in turns if turn.number % 3 == 0]
    assert all("x-context-cached-tokens" not in turn.headers for turn in streamed)  # sent before the usage
    session.turn(stream=False)
    cost = cost_of(proxy, "cost")
    assert int(session.turns[-1].headers["x-context-cached-tokens"]) == cost["turns"][-1]["cached_tokens"] > 0
    assert metric(proxy, "context_proxy_cached_input_tokens", 'model="big"') == cost["cached_tokens"]
    assert metric(proxy, "context_proxy_prompt_tokens", 'model="big"') == cost["sent_tokens"]
    assert cost["summarizer_calls"] == 0


def test_summarizer_tokens_are_put_in_the_steps_they_ran_in(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy, client = start(serve_proxy, fake)
    session = ScriptedSession(client, fake, "summarized", model="big")
    turns = session.run(14, headers={"X-Context-Budget": "1500"})
    assert sum(turn.summarizer_requests for turn in turns) > 0

    # Background summaries may still be under way after the last turn: wait until the ledger has the fake's count.
    deadline = time.monotonic() + 10
    while True:
        calls = sum(1 for request in fake.requests if is_summarizer_request(request.body))
        cost = cost_of(proxy, "summarized")
        if cost["summarizer_calls"] == calls or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert cost["summarizer_calls"] == sum(step["summarizer_calls"] for step in cost["turns"]) == calls
    assert cost["summarizer_prompt_tokens"] > 0
    assert cost["summarizer_completion_tokens"] > 0
    assert sum(step["summarizer_tokens"] for step in cost["turns"]) == (
        cost["summarizer_prompt_tokens"] + cost["summarizer_completion_tokens"]
    )
    assert cost["requested_tokens"] > cost["counted_tokens"]  # compaction sent less than the client asked
    prompt = metric(proxy, "context_proxy_summarizer_tokens", 'kind="prompt",model="summarizer"')
    assert prompt == cost["summarizer_prompt_tokens"]


def test_a_stream_gets_a_usage_chunk_only_if_its_client_asked(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy, _client = start(serve_proxy, fake)
    body = {"model": "big", "messages": [{"role": "user", "content": "hello"}], "stream": True}
    for options, expected in (({}, 0), ({"stream_options": {"include_usage": True}}, 1)):
        with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json={**body, **options}, timeout=10) as answer:
            lines = [line for line in answer.iter_lines() if line.startswith("data: {")]
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
        assert sum(1 for chunk in chunks if chunk.get("usage")) == expected
        assert fake.requests[-1].body["stream_options"] == {"include_usage": True}
