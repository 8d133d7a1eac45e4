"""The Responses door end to end: the official `openai` SDK's `responses` API against the served proxy and the strict
fake upstream (a chat-completions provider that enforces its window and tool pairing).

Covered: non-stream and stream answers in the shapes the SDK parses (`responses.stream` checks the event order),
function and custom tool loops whose echoed items land on the stored answer, Codex-style stateless re-sends in
one session, a long conversation on a small model that compacts without a rejection, failures as
`response.failed`, and bad input refused with nothing stored.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, row_counts
from tests.support import proxy_server
from tests.support.fake_upstream import FakeUpstream, Fault, Reply
from tests.support.proxy_server import ProxyProcess, ProxyServer, make_config
from tests.support.scripted_session import fact_keeping_summary, is_summarizer_request

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}


@pytest.fixture
def sdk(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=20) as client:
        yield client


def store(proxy: ProxyServer) -> sqlite3.Connection:
    connection = sqlite3.connect(proxy.config.store.path)
    connection.row_factory = sqlite3.Row
    return connection


def test_a_string_input_is_answered_as_a_response(sdk: openai.OpenAI, fake: FakeUpstream) -> None:
    raw = sdk.responses.with_raw_response.create(model="fake", input="Say hello", instructions="Be brief.")
    response = raw.parse()
    assert response.status == "completed"
    assert response.output_text == "echo: Say hello"
    assert response.id.startswith("resp_")
    assert response.instructions == "Be brief."
    assert response.usage is not None
    assert response.usage.input_tokens > 0
    assert raw.headers["X-Session-Id"]
    assert raw.headers["X-Context-Tokens"]
    sent = fake.requests[-1].body
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]


def test_a_stream_has_the_order_the_sdk_checks(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model="fake", input=[{"role": "user", "content": "Stream please"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "echo: Stream please"
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_a_function_tool_loop_pairs_the_call_with_its_output(sdk: openai.OpenAI, fake: FakeUpstream) -> None:
    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="It is sunny in Paris.")
        call = {
            "id": "call_w1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    fake.responder = respond
    first = sdk.responses.create(model="fake", input="Weather in Paris?", tools=[WEATHER_TOOL])  # type: ignore[list-item]
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments) == ("call_w1", "get_weather", '{"city": "Paris"}')
    assert fake.requests[-1].body["tools"][0]["function"]["name"] == "get_weather"

    history: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": "call_w1", "output": "sunny"},
    ]
    second = sdk.responses.create(model="fake", input=history, tools=[WEATHER_TOOL])  # type: ignore[list-item]
    assert second.output_text == "It is sunny in Paris."
    sent = fake.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == "call_w1"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_w1", "content": "sunny"}


def test_a_custom_tool_call_goes_back_as_one_and_its_echo_lands_on_the_stored_answer(
    proxy: ProxyServer, sdk: openai.OpenAI, fake: FakeUpstream
) -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"

    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="Patched.")
        arguments = json.dumps({"input": patch}, indent=1)  # spacing the client will not reproduce
        call = {"id": "call_p1", "type": "function", "function": {"name": "apply_patch", "arguments": arguments}}
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    fake.responder = respond
    headers = {"session-id": "codex-thread-1"}
    first = sdk.responses.create(model="fake", input="Add a.txt", tools=[PATCH_TOOL], extra_headers=headers)  # type: ignore[list-item]
    (call,) = first.output
    assert call.type == "custom_tool_call"
    assert call.input == patch
    tool = fake.requests[-1].body["tools"][0]["function"]
    assert tool["parameters"]["required"] == ["input"]
    assert "start: /.+/" in tool["description"]

    history: list[Any] = [
        {"type": "message", "id": "msg_u1", "role": "user", "content": [{"type": "input_text", "text": "Add a.txt"}]},
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": "call_p1", "output": "Success."},
    ]
    second = sdk.responses.create(model="fake", input=history, tools=[PATCH_TOOL], extra_headers=headers)  # type: ignore[list-item]
    assert second.output_text == "Patched."
    with store(proxy) as db:
        sessions = db.execute("SELECT id FROM sessions").fetchall()
        roles = [row["role"] for row in db.execute("SELECT role FROM messages ORDER BY depth")]
    assert [row["id"] for row in sessions] == ["codex-thread-1"]
    assert roles == ["user", "assistant", "tool", "assistant"]  # the echoed call is the stored answer


def test_stateless_resends_in_a_codex_session_store_only_what_is_new(
    proxy: ProxyServer, sdk: openai.OpenAI, fake: FakeUpstream
) -> None:
    headers = {"session-id": "thread-7"}
    developer = {
        "type": "message",
        "id": "msg_dev",
        "role": "developer",
        "content": [{"type": "input_text", "text": "You are Codex."}],
    }
    items: list[Any] = [developer]
    for turn in range(4):
        items.append(
            {
                "type": "message",
                "id": f"msg_{turn}",
                "role": "user",
                "content": [{"type": "input_text", "text": f"step {turn}"}],
            }
        )
        response = sdk.responses.create(model="fake", input=items, store=False, stream=False, extra_headers=headers)
        items.extend(item.model_dump(exclude_none=True) for item in response.output)
    assert fake.requests[-1].body["store"] is False  # what the client asked of the upstream
    roles = [m["role"] for m in fake.requests[-1].body["messages"]]
    assert roles[1:] == ["user", "assistant"] * 3 + ["user"]
    assert roles[0] in ("developer", "system")  # LiteLLM says `system` to a model it does not know
    with store(proxy) as db:
        assert [row["id"] for row in db.execute("SELECT id FROM sessions")] == ["thread-7"]
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1 + 4 * 2
        bodies = [json.loads(row["body"]) for row in db.execute("SELECT body FROM messages WHERE role = 'user'")]
    assert bodies[0]["items"][0]["id"] == "msg_0"  # the client's own item is kept as it came


@pytest.mark.parametrize("chained", [False, True], ids=["stateless", "previous_response_id"])
def test_a_long_conversation_on_a_small_model_compacts_without_a_rejection(
    serve_proxy: ServeProxy, fake: FakeUpstream, chained: bool
) -> None:
    """60 requests of a tool loop on a 4k model, the whole input re-sent each time (as Codex does) or chained by
    `previous_response_id`: the strict upstream refuses nothing (window, pairing, role order), summaries are
    written, and a fact planted in the first turn still reaches the model at the end."""
    fake.context_window = 4096
    fake.strict_roles = True
    model = {
        "name": "small",
        "model": "openai/fake-model",
        "api_base": fake.url,
        "api_key": "k",
        "context_window": 4096,
    }
    proxy = serve_proxy(models=[model])
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30)

    def respond(body: dict[str, Any]) -> Reply:
        if is_summarizer_request(body):
            return fact_keeping_summary(body)
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return Reply(content="noted " * 40)
        call = {
            "id": f"call_{len(messages)}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"},
        }
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    fake.responder = respond
    items: list[Any] = [{"role": "user", "content": "Remember FACT-vault-8812. " + "filler " * 150}]
    previous: str | None = None

    def ask(new: list[Any]) -> Any:
        nonlocal previous
        sent = new if chained else items
        extra = {"previous_response_id": previous} if chained and previous else {}
        response = client.responses.create(model="small", input=sent, tools=[WEATHER_TOOL], **extra)  # type: ignore[arg-type]
        previous = response.id
        items.extend(item.model_dump(exclude_none=True) for item in response.output)
        return response

    with client:
        pending: list[Any] = list(items)
        for turn in range(30):
            (call,) = ask(pending).output
            pending = [{"type": "function_call_output", "call_id": call.call_id, "output": "result " * 40}]  # type: ignore[union-attr]
            items.extend(pending)
            ask(pending)
            pending = [{"role": "user", "content": f"turn {turn}: continue " + "more " * 40}]
            items.extend(pending)
    assert fake.rejected == []
    with store(proxy) as db:
        assert db.execute("SELECT COUNT(*) FROM summaries").fetchone()[0] > 0
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    last = [r.body["messages"] for r in fake.requests if not is_summarizer_request(r.body)][-1]
    assert any("FACT-vault-8812" in json.dumps(message) for message in last)


def test_a_failure_mid_stream_is_a_response_failed_event(sdk: openai.OpenAI, fake: FakeUpstream) -> None:
    fake.responder = lambda body: Reply(content="word " * 30)
    fake.fail_next(
        Fault(
            error_after_chunks=3,
            body={"error": {"message": "overloaded", "type": "server_error", "code": "overloaded"}},
        )
    )
    events = list(sdk.responses.create(model="fake", input="go", stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed"
    assert failed.error is not None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake"}, "input"),
        ({"model": "fake", "input": 42}, "input"),
        ({"model": "fake", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input"),
        ({"model": "fake", "input": [{"type": "message", "role": "wizard", "content": "hi"}]}, "input[0].role"),
        (
            {"model": "fake", "input": [{"type": "function_call", "call_id": "c", "name": 3, "arguments": "{}"}]},
            "input[0].name",
        ),
        ({"model": "fake", "input": "hi", "max_output_tokens": "many"}, "max_output_tokens"),
        ({"model": "fake", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ],
)
def test_bad_input_is_a_400_that_stores_nothing(proxy: ProxyServer, body: dict[str, Any], param: str) -> None:
    before = row_counts(proxy.config.store.path)
    response = httpx.post(f"{proxy.base_url}/responses", json=body, timeout=10)
    assert response.status_code == 400, response.text
    assert assert_openai_error(response.json())["param"] == param
    assert row_counts(proxy.config.store.path) == before


# --- stored responses and previous_response_id --------------------------------------------------------------------


def test_previous_response_id_continues_the_stored_conversation(
    proxy: ProxyServer, sdk: openai.OpenAI, fake: FakeUpstream
) -> None:
    first = sdk.responses.create(model="fake", input="My name is Ada.", instructions="Old rules.")
    second = sdk.responses.create(
        model="fake", input="What is my name?", previous_response_id=first.id, instructions="New rules."
    )
    third = sdk.responses.create(model="fake", input="And again?", previous_response_id=second.id)
    sent = fake.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]  # no instructions
    assert [m["content"] for m in sent[::2]] == ["My name is Ada.", "What is my name?", "And again?"]
    assert fake.requests[-2].body["messages"][0] == {"role": "system", "content": "New rules."}
    assert third.previous_response_id == second.id
    with store(proxy) as db:
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1  # one chain, one session


def test_a_stored_response_can_be_read_listed_and_deleted(sdk: openai.OpenAI) -> None:
    items: list[Any] = [
        {"type": "message", "id": "msg_given", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"role": "user", "content": "two"},
    ]
    created = sdk.responses.create(model="fake", input=items, instructions="Be kind.", metadata={"k": "v"})
    again = sdk.responses.retrieve(created.id)
    assert again.id == created.id
    assert again.output_text == created.output_text
    assert again.status == "completed"
    assert again.metadata == {"k": "v"}
    listed = sdk.responses.input_items.list(created.id, order="asc")
    assert listed.data[0].id == "msg_given"
    assert len(listed.data) == 2  # instructions are not an input item
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="fake", input="more", previous_response_id=created.id)
    assert caught.value.code == "previous_response_not_found"


def test_store_false_responses_are_not_retrievable_but_the_history_keeps_them(
    proxy: ProxyServer, sdk: openai.OpenAI
) -> None:
    created = sdk.responses.create(model="fake", input="secret plans", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    with store(proxy) as db:
        assert (
            db.execute("SELECT COUNT(*) FROM messages WHERE role = 'user' AND body LIKE '%secret plans%'").fetchone()[0]
            == 1
        )


def test_another_tenants_and_unknown_response_ids_are_404(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": ["key-a", "key-b"]})
    with (
        openai.OpenAI(base_url=proxy.base_url, api_key="key-a", max_retries=0) as a,
        openai.OpenAI(base_url=proxy.base_url, api_key="key-b", max_retries=0) as b,
    ):
        created = a.responses.create(model="fake", input="mine")
        for response_id in (created.id, "resp_ffffffffffffffff", "resp_nope", "nothing"):
            with pytest.raises(openai.NotFoundError):
                b.responses.retrieve(response_id)
        before = row_counts(proxy.config.store.path)
        with pytest.raises(openai.NotFoundError):
            b.responses.create(model="fake", input="continue", previous_response_id=created.id)
        assert row_counts(proxy.config.store.path) == before
        assert a.responses.retrieve(created.id).output_text == created.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_an_idempotency_key_retry_is_answered_from_the_journal(
    proxy: ProxyServer, fake: FakeUpstream, stream: bool
) -> None:
    body = {"model": "fake", "input": "only once", "stream": stream}
    headers = {"Idempotency-Key": f"key-{stream}"}
    first = httpx.post(f"{proxy.base_url}/responses", json=body, headers=headers, timeout=10)
    calls = len(fake.requests)
    second = httpx.post(f"{proxy.base_url}/responses", json=body, headers=headers, timeout=10)
    assert len(fake.requests) == calls  # no second upstream call
    assert second.headers["X-Context-Replay"] == "true"
    if stream:
        assert first.text == second.text  # the same events, the same ids
        assert "event: response.completed" in second.text
    else:
        assert first.json() == second.json()
    journal = httpx.get(f"{proxy.url}/journal", timeout=10).json()
    assert [step["status"] for step in journal["data"]] == ["sealed"]


def test_a_stream_cut_by_kill_9_reads_back_as_what_the_client_saw(
    tmp_path: Path, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kill -9` mid-stream: after a restart the response reads back `cancelled` with at least the text its
    client saw (the journal had it before the client did), and the journal shows the step interrupted."""
    monkeypatch.setattr(proxy_server, "START_TIMEOUT_S", 60.0)  # a child process imports LiteLLM first
    long_reply = " ".join(f"w{n}" for n in range(60))
    fake.responder = lambda body: Reply(content=long_reply)
    fake.chunk_delay_s = 0.25
    raw = make_config(tmp_path, fake.url)
    first = ProxyProcess(raw, tmp_path)
    first.start()
    seen, response_id = "", ""
    try:
        body = {"model": "fake", "input": "tell me a long story", "stream": True}
        with (
            httpx.Client(base_url=first.url, timeout=30) as http,
            http.stream("POST", "/v1/responses", json=body) as cut,
        ):
            for line in cut.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event["type"] == "response.created":
                    response_id = event["response"]["id"]
                if event["type"] == "response.output_text.delta":
                    seen += event["delta"]
                    if len(seen.split()) >= 10:
                        first.kill()
                        break
    finally:
        first.kill()
    assert_read_back_cut(raw, tmp_path, response_id, seen, long_reply)


def assert_read_back_cut(raw: dict[str, Any], tmp_path: Path, response_id: str, seen: str, whole: str) -> None:
    """After a restart, the response cut by kill -9 reads back `cancelled` with at least what its client saw, and
    the journal shows its step interrupted."""
    second = ProxyProcess(raw, tmp_path)
    second.start()
    try:
        with httpx.Client(base_url=second.url, timeout=30) as http:
            stored = http.get(f"/v1/responses/{response_id}").json()
            steps = http.get("/journal").json()["data"]
    finally:
        second.stop()
    assert stored["status"] == "cancelled"
    text = stored["output"][0]["content"][0]["text"]
    assert text.startswith(seen)
    assert whole.startswith(text)
    assert [step["status"] for step in steps] == ["interrupted"]
