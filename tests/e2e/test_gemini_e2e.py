"""The Gemini door end to end: the official `google-genai` SDK against the served proxy and the strict chat fake
upstream (window and tool pairing enforced).

Covered: `generate_content` and `generate_content_stream` (sync and async), a function-calling loop whose echoed
`functionCall` lands on the stored answer (one session, no branch), `count_tokens`, `usageMetadata` with the
prompt cache's share, the key from `x-goog-api-key` or `?key=` (never in the access log), the `/v1` paths beside
OpenAI's `/v1/models`, a stream without `alt=sse` as one JSON array, and failures in Google's shape: before the
stream with the upstream's status, after its start as a last `error` element.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Fault, Reply
from tests.support.proxy_server import ProxyServer

KEY = "sk-proxy-gemini-0123456789"
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}, required=["city"]
    ),
)
NO_AUTOMATIC_CALLS = types.AutomaticFunctionCallingConfig(disable=True)


def sdk_client(proxy: ProxyServer, api_key: str = "unused", version: str = "v1beta") -> genai.Client:
    options = types.HttpOptions(base_url=proxy.url, api_version=version, timeout=20_000)
    return genai.Client(api_key=api_key, http_options=options)


@pytest.fixture
async def sdk(proxy: ProxyServer) -> AsyncIterator[genai.Client]:
    # Both of its clients closed after the test: a session left to the garbage collector leaks sockets.
    client = sdk_client(proxy)
    yield client
    client.close()
    await client.aio.aclose()


def sessions(proxy: ProxyServer) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = httpx.get(f"{proxy.url}/sessions", timeout=10).json()["data"]
    return listed


def tool_reply(body: dict[str, Any]) -> Reply:
    """A function call for a user turn, a text answer after a function's result."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content=f"The tool said: {messages[-1]['content']}")
    call = {
        "id": f"call_{len(messages)}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    return Reply(tool_calls=[call], finish_reason="tool_calls")


@pytest.mark.parametrize("sync", [True, False])
async def test_content_is_generated_in_geminis_shape(sdk: genai.Client, fake: FakeUpstream, sync: bool) -> None:
    config = types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=100, temperature=0.5)
    if sync:
        response = sdk.models.generate_content(model="fake", contents="Say hello", config=config)
    else:
        response = await sdk.aio.models.generate_content(model="fake", contents="Say hello", config=config)
    assert response.text == "echo: Say hello"
    assert response.candidates is not None
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    assert response.model_version == "fake"
    usage = response.usage_metadata
    assert usage is not None
    assert usage.prompt_token_count == fake.served[-1].prompt_tokens
    assert usage.candidates_token_count == 4  # "echo: Say hello" in the fake's word pieces
    assert usage.cached_content_token_count == 0
    body = fake.requests[-1].body
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]
    assert (body["max_tokens"], body["temperature"]) == (100, 0.5)


@pytest.mark.parametrize("sync", [True, False])
async def test_a_stream_is_a_response_per_delta_and_the_usage_last(
    sdk: genai.Client, fake: FakeUpstream, sync: bool
) -> None:
    if sync:
        chunks = list(sdk.models.generate_content_stream(model="fake", contents="Stream please"))
    else:
        chunks = [
            chunk
            async for chunk in await sdk.aio.models.generate_content_stream(model="fake", contents="Stream please")
        ]
    assert "".join(chunk.text or "" for chunk in chunks) == "echo: Stream please"
    assert len(chunks) > 2
    last = chunks[-1]
    assert last.candidates is not None
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata is not None
    assert last.usage_metadata.prompt_token_count == fake.served[-1].prompt_tokens
    assert all(chunk.response_id == last.response_id for chunk in chunks)
    assert fake.requests[-1].body["stream"] is True


def test_a_function_calling_loop_lands_on_the_stored_answer(
    proxy: ProxyServer, sdk: genai.Client, fake: FakeUpstream
) -> None:
    fake.responder = tool_reply
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[WEATHER])], automatic_function_calling=NO_AUTOMATIC_CALLS
    )
    question = types.Content(role="user", parts=[types.Part(text="Weather in Paris?")])
    first = sdk.models.generate_content(model="fake", contents=[question], config=config)
    assert first.function_calls is not None
    call = first.function_calls[0]
    assert (call.name, call.args, call.id) == ("get_weather", {"city": "Paris"}, "call_1")
    tools = fake.requests[-1].body["tools"]
    assert tools[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    assert first.candidates is not None
    assert first.candidates[0].content is not None
    result = types.Part.from_function_response(name="get_weather", response={"output": "Sunny, 21 C"})
    assert result.function_response is not None
    result.function_response.id = call.id
    history = [question, first.candidates[0].content, types.Content(role="user", parts=[result])]
    second = sdk.models.generate_content(model="fake", contents=history, config=config)
    assert second.text == "The tool said: Sunny, 21 C"
    sent = fake.requests[-1].body["messages"]
    assert [message["role"] for message in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"] == "call_1"
    assert sent[2]["content"] == "Sunny, 21 C"
    (session,) = sessions(proxy)
    stored = httpx.get(f"{proxy.url}/sessions/{session['id']}", timeout=10).json()
    assert [message["role"] for message in stored["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_count_tokens_is_what_the_proxy_would_send(sdk: genai.Client, fake: FakeUpstream) -> None:
    counted = sdk.models.count_tokens(model="fake", contents="How many tokens is this sentence?")
    sdk.models.generate_content(model="fake", contents="How many tokens is this sentence?")
    assert counted.total_tokens == fake.served[-1].prompt_tokens


def test_the_prompt_caches_share_is_the_cached_content_token_count(sdk: genai.Client, fake: FakeUpstream) -> None:
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 300
    sdk.models.generate_content(model="fake", contents=long_prompt)
    again = sdk.models.generate_content(model="fake", contents=long_prompt)
    assert again.usage_metadata is not None
    cached = again.usage_metadata.cached_content_token_count
    assert cached is not None
    assert cached >= 1024
    assert cached == fake.served[-1].cached_tokens


def test_the_key_comes_as_x_goog_api_key_or_in_the_query_and_is_never_logged(
    serve_proxy: ServeProxy, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = serve_proxy(auth={"keys": [KEY]})
    with sdk_client(proxy, api_key=KEY) as client:
        assert client.models.generate_content(model="fake", contents="hi").text == "echo: hi"
    with sdk_client(proxy, api_key="sk-wrong") as client, pytest.raises(errors.ClientError) as wrong:
        client.models.generate_content(model="fake", contents="hi")
    assert (wrong.value.code, wrong.value.status) == (401, "UNAUTHENTICATED")
    url = f"{proxy.url}/v1beta/models/fake:generateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        by_query = httpx.post(url, params={"key": KEY}, json=body, timeout=10)
    assert by_query.status_code == 200, by_query.text
    assert KEY not in caplog.text
    missing = httpx.post(url, json=body, timeout=10)
    assert missing.status_code == 401
    assert missing.json()["error"]["status"] == "UNAUTHENTICATED"
    assert "x-goog-api-key" in missing.json()["error"]["message"]


def test_the_v1_paths_are_served_beside_openais_models(proxy: ProxyServer, fake: FakeUpstream) -> None:
    with sdk_client(proxy, version="v1") as client:
        assert client.models.generate_content(model="fake", contents="hi").text == "echo: hi"
    listed = httpx.get(f"{proxy.url}/v1/models", timeout=10)
    assert listed.json()["object"] == "list"
    unknown = httpx.get(f"{proxy.url}/v1/models/nothing", timeout=10).json()
    assert unknown["error"]["code"] == "model_not_found"  # OpenAI's shape: not a Gemini path


def test_a_stream_without_alt_sse_is_one_json_array(proxy: ProxyServer) -> None:
    body = {"contents": [{"parts": [{"text": "Array please"}]}]}
    answer = httpx.post(f"{proxy.url}/v1beta/models/fake:streamGenerateContent", json=body, timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    elements = json.loads(answer.text)
    assert isinstance(elements, list)
    assert len(elements) > 2
    text = "".join(
        part["text"] for element in elements for part in element["candidates"][0].get("content", {}).get("parts", [])
    )
    assert text == "echo: Array please"
    assert elements[-1]["candidates"][0]["finishReason"] == "STOP"


def test_failures_are_in_googles_shape_with_their_status(sdk: genai.Client, fake: FakeUpstream) -> None:
    with pytest.raises(errors.ClientError) as unknown:
        sdk.models.generate_content(model="no-such-model", contents="hi")
    assert (unknown.value.code, unknown.value.status) == (404, "NOT_FOUND")
    fake.fail_next(Fault(status=429, headers={"retry-after": "1"}))
    with pytest.raises(errors.ClientError) as limited:
        sdk.models.generate_content(model="fake", contents="hi")
    assert (limited.value.code, limited.value.status) == (429, "RESOURCE_EXHAUSTED")
    fake.fail_next(Fault(status=500))
    with pytest.raises(errors.ServerError) as failed:
        sdk.models.generate_content(model="fake", contents="hi")
    assert failed.value.code == 500


def test_bad_requests_are_refused_in_googles_shape_naming_the_field(proxy: ProxyServer, fake: FakeUpstream) -> None:
    url = f"{proxy.url}/v1beta/models/fake:generateContent"
    orphan = {"functionResponse": {"name": "f", "id": "x", "response": {}}}
    cases = [
        ("contents", {"contents": []}),
        ("contents[0].role", {"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}),
        ("contents[0].parts", {"contents": [{"role": "user", "parts": []}]}),
        ("functionResponse", {"contents": [{"role": "user", "parts": [orphan]}]}),
    ]
    for field, body in cases:
        refused = httpx.post(url, json=body, timeout=10)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
        assert field in error["message"]
    wrong_method = httpx.post(f"{proxy.url}/v1beta/models/fake:embedContent", json={}, timeout=10)
    assert wrong_method.status_code == 404
    assert wrong_method.json()["error"]["status"] == "NOT_FOUND"
    assert fake.requests == []


def test_a_failure_after_the_stream_started_is_its_last_element(sdk: genai.Client, fake: FakeUpstream) -> None:
    fake.fail_next(Fault(error_after_chunks=2))
    with pytest.raises(errors.APIError) as failed:
        list(sdk.models.generate_content_stream(model="fake", contents="Stream then fail"))
    assert failed.value.code >= 500


SESSION_CONTEXT = "<session_context>\nThis is the Gemini CLI. Today is Wednesday.\n</session_context>"
SNAPSHOT_SYSTEM = (  # @google/gemini-cli 0.61.0, getCompressionPrompt: its opening
    "You are a specialized system component responsible for distilling chat history into a structured XML "
    "<state_snapshot>."
)
SNAPSHOT_PROMPT = (
    "Generate a new <state_snapshot> based on the provided history.\n\nFirst, reason in your scratchpad. Then, "
    "generate the updated <state_snapshot>."
)
SNAPSHOT_CHECK = (
    "Critically evaluate the <state_snapshot> you just generated. Did you omit any specific technical details, file "
    "paths, tool results, or user constraints mentioned in the history? If anything is missing or could be more "
    "precise, generate a FINAL, improved <state_snapshot>. Otherwise, repeat the exact same <state_snapshot> again."
)
ACKNOWLEDGED = "Got it. Thanks for the additional context!"


def test_gemini_clis_own_compression_is_answered_from_the_store_and_its_snapshot_brings_the_conversation_back(
    proxy: ProxyServer, sdk: genai.Client, fake: FakeUpstream
) -> None:
    """Gemini CLI 0.61.0 compresses its history by itself (`ChatCompressionService`, at half its window): the older
    part of its history with a snapshot prompt, then that history, the snapshot as the model's turn and a prompt to
    check it; then it keeps the snapshot as a user turn, a model turn of its own acknowledging it, and its recent
    turns. Both calls are answered with no model call, and the next request sends the upstream every original
    again, in one session, without the snapshot or the acknowledgement."""
    main = types.GenerateContentConfig(system_instruction="You are Gemini CLI.")
    history: list[types.Content] = []
    for turn in range(3):
        text = types.Part(text=f"turn {turn}: remember FACT_{turn}")
        parts = [types.Part(text=SESSION_CONTEXT), text] if turn == 0 else [text]
        history.append(types.Content(role="user", parts=parts))
        answer = sdk.models.generate_content(model="fake", contents=history, config=main)
        history.append(types.Content(role="model", parts=[types.Part(text=answer.text)]))
    calls = len(fake.requests)
    older, kept = history[:4], history[4:]
    snapshot = types.GenerateContentConfig(system_instruction=SNAPSHOT_SYSTEM)
    ask = types.Content(role="user", parts=[types.Part(text=SNAPSHOT_PROMPT)])
    first = sdk.models.generate_content(model="fake", contents=[*older, ask], config=snapshot)
    check = [*older, types.Content(role="model", parts=[types.Part(text=first.text)])]
    check.append(types.Content(role="user", parts=[types.Part(text=SNAPSHOT_CHECK)]))
    final = sdk.models.generate_content(model="fake", contents=check, config=snapshot)
    assert len(fake.requests) == calls  # no model call
    assert final.text is not None
    assert "ctxinf1." in final.text
    assert "FACT_1" in final.text

    compressed = [
        types.Content(role="user", parts=[types.Part(text=SESSION_CONTEXT), types.Part(text=final.text)]),
        types.Content(role="model", parts=[types.Part(text=ACKNOWLEDGED)]),
        *kept,
        types.Content(role="user", parts=[types.Part(text="turn 3: which FACT came first?")]),
    ]
    sdk.models.generate_content(model="fake", contents=compressed, config=main)
    sent = fake.requests[-1].body["messages"]
    texts = [str(message.get("content")) for message in sent]
    assert texts[0] == "You are Gemini CLI."
    assert texts[1].startswith("<session_context>")
    assert texts[2:] == [
        "turn 0: remember FACT_0",
        "echo: turn 0: remember FACT_0",
        "turn 1: remember FACT_1",
        "echo: turn 1: remember FACT_1",
        "turn 2: remember FACT_2",
        "echo: turn 2: remember FACT_2",
        "turn 3: which FACT came first?",
    ]
    (session,) = sessions(proxy)
    stored = httpx.get(f"{proxy.url}/sessions/{session['id']}", timeout=10).json()["messages"]
    assert [message["role"] for message in stored] == ["system", "system", *["user", "assistant"] * 4]
