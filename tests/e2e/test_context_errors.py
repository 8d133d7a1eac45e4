"""Context-window refusals in every provider's words: recognized at the boundary, healed once, learned from.

Three levels, each with real parts: the recognizer over the error bodies real providers send
(`proxy.upstream.context_window`), the LiteLLM boundary against the fake upstream answering in each provider's
dialect (both LiteLLM routes), and the served proxy driven by the official OpenAI SDK, where an upstream whose
tokenizer counts 27 % more than ours refuses the first over-window request once and never again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from proxy import environment
from proxy.config.models import ModelEntry
from proxy.config.schema import UpstreamConfig
from proxy.errors import ContextOverflow, UpstreamError
from proxy.upstream.context_window import context_overflow, reported_counts
from proxy.upstream.failures import upstream_error
from proxy.upstream.litellm_client import LiteLLMUpstream
from proxy.upstream.protocol import UpstreamCall
from tests.conftest import ServeProxy
from tests.support.context_dialects import DIALECTS, OLLAMA_MESSAGE, llama_cpp
from tests.support.fake_upstream import FakeUpstream, Fault, error_body
from tests.support.proxy_server import ProxyServer

# --- the recognizer, over what real providers send ------------------------------------------------------------

OPENAI_CODE = "context_length_exceeded"
RECOGNIZED: list[tuple[str, int, dict[str, Any], tuple[int | None, int | None]]] = [
    (
        "openai",
        400,
        {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
            "130532 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": OPENAI_CODE,
        },
        (130532, 128000),
    ),
    (
        "openai, without counts",
        400,
        {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error",
            "param": "input",
            "code": OPENAI_CODE,
        },
        (None, None),
    ),
    (
        "openai gpt-5",
        400,
        {
            "message": "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 300512 "
            "tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": OPENAI_CODE,
        },
        (300512, 272000),
    ),
    (
        "azure",
        400,
        {
            "message": "This model's maximum context length is 8192 tokens. However, you requested 8500 tokens "
            "(7500 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": OPENAI_CODE,
        },
        (7500, 8192),
    ),
    (
        "anthropic",
        400,
        {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"},
        (208310, 200000),
    ),
    (
        "anthropic, input and max_tokens",
        400,
        {
            "type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 197202 + 21333 > 200000, decrease input "
            "length or `max_tokens` and try again",
        },
        (197202, 200000),
    ),
    (
        "vllm before 0.10",
        400,
        {
            "message": "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
            "(2000 in the messages, 100 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        (2000, 2048),
    ),
    (
        "vllm, input only",
        400,
        {
            "message": "This model's maximum context length is 32768 tokens. However, your request has 40000 input "
            "tokens. Please reduce the length of the input messages.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        (40000, 32768),
    ),
    (
        "vllm, input and output",
        400,
        {
            "message": "This model's maximum context length is 40960 tokens. However, you requested 0 output tokens "
            "and your prompt contains at least 40961 input tokens, for a total of at least 40961 tokens. Please "
            "reduce the length of the input prompt or the number of requested output tokens. "
            "(parameter=input_tokens, value=40961)",
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        },
        (40961, 40960),
    ),
    (
        "vllm, max_tokens too large",
        400,
        {
            "message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context "
            "length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        (2778, 4096),
    ),
    (
        "vllm, decoder prompt",
        400,
        {
            "message": "The decoder prompt (length 12324) is longer than the maximum model length of 8192. Make sure "
            "that `max_model_len` is no smaller than the number of text tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        (12324, 8192),
    ),
    (
        "llama.cpp",
        400,
        {
            "code": 400,
            "message": "request (2063 tokens) exceeds the available context size (2048 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 2063,
            "n_ctx": 2048,
        },
        (2063, 2048),
    ),
    (
        "llama.cpp, older",
        400,
        {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "invalid_request_error",
        },
        (None, None),
    ),
    (
        "ollama",
        400,
        {"message": OLLAMA_MESSAGE, "type": "invalid_request_error", "param": None, "code": None},
        (None, None),
    ),
    (
        "gemini",
        400,
        {
            "message": "The input token count (1196265) exceeds the maximum number of tokens allowed (1048576).",
            "status": "INVALID_ARGUMENT",
            "code": 400,
        },
        (1196265, 1048576),
    ),
    (
        "mistral",
        400,
        {
            "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum "
            "context length",
            "type": "invalid_request_message_error",
            "param": None,
            "code": "3051",
        },
        (40000, 32768),
    ),
    (
        "openrouter",
        400,
        {
            "message": "This endpoint's maximum context length is 8192 tokens. However, you requested about 12000 "
            "tokens (10000 of text input, 2000 in the output). Please reduce the length of either one, or use the "
            '"middle-out" transform to compress your prompt automatically.',
            "code": 400,
        },
        (10000, 8192),
    ),
    (
        "sglang",
        400,
        {
            "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        (5000, 4096),
    ),
]
NOT_CONTEXT: list[tuple[str, int, dict[str, Any]]] = [
    (
        "a rate limit that speaks of tokens",
        429,
        {
            "message": "Request too large for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, "
            "Requested 50000. The input or output tokens must be reduced in order to run successfully.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        },
    ),
    (
        "a bad parameter",
        400,
        {
            "message": "Invalid value for 'temperature': must be between 0 and 2.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        },
    ),
    (
        "a string over its length limit",
        400,
        {
            "message": "Invalid 'messages[0].content': string too long. Expected a string with maximum length "
            "10485760, but got a string with length 10485761 instead.",
            "type": "invalid_request_error",
            "param": "messages[0].content",
            "code": "string_above_max_length",
        },
    ),
    (
        "a body over the byte limit",
        413,
        {"type": "request_too_large", "message": "Request exceeds the maximum size"},
    ),
    ("a wrong key", 401, {"message": "Incorrect API key provided.", "type": "invalid_request_error", "code": None}),
    (
        "a server error that quotes a window",
        500,
        {"message": "This model's maximum context length is 2048 tokens.", "type": "server_error", "code": None},
    ),
]


class ProviderRefusal(Exception):
    """What LiteLLM's httpx route raises: the status, and the upstream's JSON only inside the message text."""

    def __init__(
        self, status: int, body: dict[str, Any], prefix: str = "litellm.BadRequestError: OpenAIException"
    ) -> None:
        self.status_code = status
        self.message = f"{prefix} - {json.dumps(body)}"
        super().__init__(self.message)


@pytest.mark.parametrize(("provider", "status", "error", "counts"), RECOGNIZED, ids=[row[0] for row in RECOGNIZED])
def test_each_providers_refusal_is_recognized_with_its_counts(
    provider: str, status: int, error: dict[str, Any], counts: tuple[int | None, int | None]
) -> None:
    converted = upstream_error(ProviderRefusal(status, {"error": error}))

    assert counts_of(converted.context_overflow) == counts
    # What the client hears is the upstream's own status, type and message.
    assert (converted.status, converted.message) == (status, error["message"])
    assert converted.type == str(error.get("type") or "invalid_request_error")


@pytest.mark.parametrize(("case", "status", "error"), NOT_CONTEXT, ids=[row[0] for row in NOT_CONTEXT])
def test_other_refusals_are_not_taken_for_context_errors(case: str, status: int, error: dict[str, Any]) -> None:
    converted = upstream_error(ProviderRefusal(status, {"error": error}))

    assert converted.context_overflow is None
    assert converted.status == status


def test_anthropics_own_error_shape_through_litellm_is_recognized() -> None:
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"},
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
    }
    refusal = ProviderRefusal(
        400, body, "litellm.ContextWindowExceededError: litellm.BadRequestError: AnthropicException"
    )

    converted = upstream_error(refusal)

    assert counts_of(converted.context_overflow) == (208310, 200000)
    assert (converted.type, converted.message) == ("invalid_request_error", body["error"]["message"])


def test_whatever_litellm_maps_to_its_context_window_error_is_recognized() -> None:
    litellm = environment.litellm()
    mapped = litellm.ContextWindowExceededError(
        message="BedrockException - Too many input tokens for this model.", model="bedrock/x", llm_provider="bedrock"
    )

    converted = upstream_error(mapped)

    assert converted.status == 400
    assert counts_of(converted.context_overflow) == (None, None)


def test_the_counts_of_a_message_alone() -> None:
    assert counts_of(reported_counts("prompt is too long: 1,024 tokens > 1,000 maximum")) == (1024, 1000)
    assert reported_counts("Bad request.") is None
    assert context_overflow(400, {"code": OPENAI_CODE}, "Bad request.") == ContextOverflow(coded=True)
    assert counts_of(context_overflow(400, {"type": "exceed_context_size_error", "n_ctx": 512}, "")) == (None, 512)
    # llama.cpp's fields win over its sentence.
    sentence = "request (9 tokens) exceeds the available context size (8 tokens)"
    assert counts_of(context_overflow(400, {"n_prompt_tokens": 700, "n_ctx": 512}, sentence)) == (700, 512)


def counts_of(overflow: ContextOverflow | None) -> tuple[int | None, int | None]:
    assert overflow is not None
    return overflow.prompt_tokens, overflow.context_window


# --- the LiteLLM boundary, against the fake upstream speaking each dialect ------------------------------------

DIALECT_COUNTS = {
    "llama.cpp": (True, True),
    "anthropic": (True, True),
    "vllm": (True, True),
    "vllm-current": (True, True),
    "ollama": (False, False),
}
"""Dialect → (reports the prompt count, reports the window)."""
ROUTES = ("openai/fake-model", "hosted_vllm/fake-model")
"""LiteLLM's pass-through httpx route, and a provider it translates (its own exception mapping and stream wrapper)."""


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_a_refusal_in_each_dialect_crosses_the_litellm_boundary_marked(
    fake: FakeUpstream, dialect: str, stream: bool, model: str
) -> None:
    fake.context_window, fake.token_ratio, fake.context_dialect = 100, 1.27, DIALECTS[dialect]
    entry = ModelEntry("local", model, fake.url, "sk-local", 100, 20)
    upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=10), (entry,))
    messages = [{"role": "user", "content": "word " * 120}]
    expected_prompt = fake.prompt_tokens(messages)

    with pytest.raises(UpstreamError) as caught:
        try:
            if stream:
                await upstream.open_stream(UpstreamCall(entry, messages, {"stream": True}))
            else:
                await upstream.complete(UpstreamCall(entry, messages, {}))
        finally:
            await upstream.aclose()

    error = caught.value
    refusal = DIALECTS[dialect](expected_prompt, 0, 100)
    assert refusal is not None
    status, body = refusal
    assert (error.status, error.message) == (status, body["error"]["message"])
    assert error.context_overflow is not None
    reports_prompt, reports_window = DIALECT_COUNTS[dialect]
    assert error.context_overflow.prompt_tokens == (expected_prompt if reports_prompt else None)
    assert error.context_overflow.context_window == (100 if reports_window else None)


# --- the served proxy: heal once, learn, never again -----------------------------------------------------------

WINDOW, MAX_OUTPUT = 4096, 256
BUDGET = WINDOW - MAX_OUTPUT - math.ceil(0.05 * WINDOW)
RATIO = 1.27
"""llama.cpp serving SmolLM2 counted 27 % more than our tiktoken count."""
SUMMARIZER_ID = "fake-summarizer"
WORDS_PER_MESSAGE = 206
"""About 300 tokens a message: 12 of them (3,618 tokens) just fit our budget, and not the upstream's count."""
HISTORY = 12


def local_models(url: str) -> list[dict[str, Any]]:
    common = {"api_base": url, "context_window": WINDOW, "max_output": MAX_OUTPUT}
    return [
        {"name": "local", "model": "openai/fake-model", **common},
        {"name": "summarizer", "model": f"openai/{SUMMARIZER_ID}", **common},
    ]


@pytest.fixture
def local(serve_proxy: ServeProxy, fake: FakeUpstream) -> Iterator[tuple[ProxyServer, openai.OpenAI]]:
    proxy = serve_proxy(models=local_models(fake.url), context={"summarizer_model": "summarizer"})
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        yield proxy, client


def words(turn: int, count: int = WORDS_PER_MESSAGE) -> str:
    return " ".join(f"w{turn}x{index % 50}" if index % 7 == 0 else "lorem" for index in range(count))


def long_history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(HISTORY):
        messages.append({"role": "user" if turn % 2 == 0 else "assistant", "content": words(turn)})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def chat_requests(fake: FakeUpstream, since: int = 0) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests[since:] if r.body.get("model") != SUMMARIZER_ID]


def refused(fake: FakeUpstream, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests the fake counted as over its window."""
    return [body for body in requests if fake.prompt_tokens(body["messages"]) > fake.context_window]


def ask(
    client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool, **extra: Any
) -> tuple[str, dict[str, str]]:
    sdk = cast("list[ChatCompletionMessageParam]", messages)
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model="local", messages=sdk, stream=True, **extra
        ) as response:
            text = "".join(chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices)
            return text, dict(response.headers.items())
    raw = client.chat.completions.with_raw_response.create(model="local", messages=sdk, **extra)
    return raw.parse().choices[0].message.content or "", dict(raw.headers.items())


@pytest.mark.parametrize(
    ("dialect", "ratio"),
    [("llama.cpp", RATIO), ("anthropic", RATIO), ("vllm", RATIO), ("vllm-current", RATIO), ("ollama", 1.14)],
)
@pytest.mark.parametrize("stream", [False, True])
def test_the_first_over_window_request_heals_once_and_later_turns_fit(
    local: tuple[ProxyServer, openai.OpenAI], fake: FakeUpstream, dialect: str, ratio: float, stream: bool
) -> None:
    """Ollama says no number, so the fixed step (1.15) is learned: its tokenizer counts a little less than that."""
    _proxy, client = local
    fake.context_window, fake.token_ratio, fake.context_dialect = WINDOW, ratio, DIALECTS[dialect]
    messages = long_history()
    assert fake.count_tokens(messages) <= BUDGET  # it fits our count...
    assert fake.prompt_tokens(messages) > WINDOW  # ...and not the upstream's

    answer, headers = ask(client, messages, stream)

    first = chat_requests(fake)
    assert len(first) == 2, "refused once, healed once"
    assert first[0]["messages"] == messages  # it fitted our count: sent as it came
    assert refused(fake, first) == [first[0]]
    assert answer.startswith("echo: and now?")
    learned = int(headers["x-context-budget"])
    assert learned < BUDGET

    seen = len(fake.requests)
    for turn in range(6):
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": words(100 + turn)}]
        answer, headers = ask(client, messages, stream=turn % 2 == 0)
        assert int(headers["x-context-budget"]) == learned
    later = chat_requests(fake, seen)
    assert len(later) == 6, "no turn was refused again"
    assert refused(fake, later) == []


def test_a_smaller_real_window_than_configured_is_learned_from_the_refusal(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    """llama.cpp started with a smaller -c than the config says: its n_ctx replaces the configured window."""
    models = local_models(fake.url)
    models[0]["context_window"] = 2 * WINDOW
    proxy = serve_proxy(models=models, context={"summarizer_model": "summarizer"})
    fake.context_window, fake.context_dialect = WINDOW, llama_cpp
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        messages = [
            *long_history(),
            {"role": "assistant", "content": words(98)},
            {"role": "user", "content": words(99)},
        ]
        assert fake.prompt_tokens(messages) > WINDOW

        _answer, headers = ask(client, messages, stream=False)

    assert len(chat_requests(fake)) == 2
    assert int(headers["x-context-budget"]) == BUDGET  # the budget of the window llama.cpp reported
    view = httpx.get(f"{proxy.url}/sessions/{headers['x-session-id']}", timeout=10).json()
    assert view["limits"] == {"context_window": WINDOW, "max_output": MAX_OUTPUT, "source": "upstream"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_that_comes_again_after_healing_reaches_the_client_as_the_upstream_sent_it(
    local: tuple[ProxyServer, openai.OpenAI], fake: FakeUpstream, stream: bool
) -> None:
    _proxy, client = local
    message = "request (10 tokens) exceeds the available context size (2048 tokens), try increasing it"
    error = {"code": 400, "message": message, "type": "exceed_context_size_error", "n_prompt_tokens": 10, "n_ctx": 2048}
    answers = Fault(status=400, body={"error": error}, when=lambda body: body["model"] != SUMMARIZER_ID)
    fake.fail_next(answers, count=2)

    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, long_history(), stream)

    assert len(chat_requests(fake)) == 2, "healed once per request, not more"
    assert caught.value.status_code == 400
    assert caught.value.type == "exceed_context_size_error"
    assert caught.value.body == {"message": message, "type": "exceed_context_size_error", "param": None, "code": "400"}


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, NOT_CONTEXT[1][2]),
        (429, NOT_CONTEXT[0][2]),
        (400, error_body("Bad request.", "invalid_request_error", None, None)["error"]),
    ],
    ids=["bad parameter", "rate limit about tokens", "bare 400"],
)
def test_an_error_that_is_not_about_the_window_is_not_retried(
    local: tuple[ProxyServer, openai.OpenAI], fake: FakeUpstream, status: int, error: dict[str, Any]
) -> None:
    _proxy, client = local
    fake.fail_next(Fault(status=status, body={"error": error}))

    with pytest.raises(openai.APIStatusError) as caught:
        ask(client, [{"role": "user", "content": "hello"}], stream=False)

    assert caught.value.status_code == status
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"] == error["message"]
    assert len(chat_requests(fake)) == 1


def test_with_context_mode_off_a_refusal_passes_through_unhealed(
    local: tuple[ProxyServer, openai.OpenAI], fake: FakeUpstream
) -> None:
    _proxy, client = local
    fake.context_window, fake.token_ratio, fake.context_dialect = WINDOW, RATIO, llama_cpp
    messages = long_history()

    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, messages, stream=False, extra_headers={"X-Context-Mode": "off"})

    assert caught.value.type == "exceed_context_size_error"
    assert len(chat_requests(fake)) == 1
