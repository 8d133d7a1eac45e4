"""Chat completions to a translated provider (Anthropic), without `litellm.acompletion`'s bookkeeping.

LiteLLM stays the provider layer: its provider config (`ProviderConfigManager`) maps the client's parameters,
gives the headers, renders the provider's request and translates its answer to OpenAI's object, and its
provider's stream iterator translates the events of a stream, as LiteLLM's own handlers drive them. What
`acompletion` adds around that per call (logging object, cost calculation, response rebuild, the stream
wrapper's per-chunk bookkeeping: ~3 ms, see bench/translated.py) a proxy does not need. The body is posted on
the direct route's pooled, bounded client (`OpenAIChat.post`: same deadlines, retries, error cutting), and
failures go through the proxy's one boundary (`proxy.upstream.failures`) in `LiteLLMUpstream`.

Only providers whose request URL the proxy can compose as LiteLLM does take this route (`TRANSLATED_PROVIDERS`).
Every other provider (Gemini, whose URL LiteLLM's Vertex handler builds with the key in the query; Bedrock,
whose requests are SigV4-signed) stays on `litellm.acompletion`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy.canonical.types import Chunk, Message
from proxy.canonical.vocabulary import chat_messages
from proxy.config.models import ModelEntry
from proxy.upstream.bounded_bodies import EVENT_STREAM
from proxy.upstream.failures import malformed_answer
from proxy.upstream.openai_chat import OpenAIChat
from proxy.upstream.protocol import UpstreamCall

ANTHROPIC_BASE = "https://api.anthropic.com/v1/messages"
ANTHROPIC_PATH = "/v1/messages"
ANTHROPIC_BASE_VARIABLES = ("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL")
ANTHROPIC_KEY_VARIABLE = "ANTHROPIC_API_KEY"
TRANSLATED_PROVIDERS = frozenset({"anthropic"})
"""Providers posted by `ProviderChat`; the URL rule is LiteLLM's `main.py` one for Anthropic, the stream's
iterator its Anthropic handler's."""
TOOL_NAMES_KEY = "_anthropic_tool_name_map"
"""Where LiteLLM's Anthropic request transform leaves the tool names it rewrote, for the answer's transform."""
_STREAM_FIELDS = ("stream", "stream_options")


@dataclass(frozen=True)
class ProviderTarget:
    """A translated provider's model: its LiteLLM provider config, URL and key, resolved once per model entry."""

    config: Any
    url: str
    api_key: str | None = field(repr=False)
    model: str
    agent: Mapping[str, str]
    """LiteLLM's `User-Agent`, which its own handlers send: the upstream sees the same client on both routes."""

    @classmethod
    def of(cls, litellm: Any, entry: ModelEntry, model: str, provider: str) -> ProviderTarget | None:
        """The target, or None for a provider that stays on `acompletion` (see the module's docstring)."""
        if provider not in TRANSLATED_PROVIDERS or os.environ.get("LITELLM_ANTHROPIC_DISABLE_URL_SUFFIX"):
            return None
        config = litellm.ProviderConfigManager.get_provider_chat_config(
            model=model, provider=litellm.LlmProviders(provider)
        )
        if config is None:
            return None
        base = entry.api_base or next(
            (os.environ[name] for name in ANTHROPIC_BASE_VARIABLES if os.environ.get(name)), ANTHROPIC_BASE
        )
        url = base if base.endswith(ANTHROPIC_PATH) else base + ANTHROPIC_PATH
        key = entry.api_key or os.environ.get(ANTHROPIC_KEY_VARIABLE) or None
        agent = dict(litellm.llms.custom_httpx.http_handler.get_default_headers())
        return cls(config, url, key, model, agent)


class _Unlogged:
    """What a provider config's `transform_response` logs to: a proxy keeps no LiteLLM call log."""

    def __init__(self) -> None:
        self.model_call_details: dict[str, Any] = {}

    def post_call(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs


class ProviderChat:
    """Renders, posts and translates one call; raises foreign failures for the caller's boundary."""

    def __init__(self, litellm: Any, http: OpenAIChat) -> None:
        self._litellm = litellm
        self._http = http

    async def complete(self, target: ProviderTarget, call: UpstreamCall) -> Chunk:
        rendered = self._render(target, call, stream=False)
        answer = await self._http.post(target.url, rendered.headers, orjson.dumps(rendered.data))
        try:
            if answer.headers.get("content-type", "").startswith(EVENT_STREAM):
                raise malformed_answer()
            await answer.aread()
        finally:
            await answer.aclose()
        response = target.config.transform_response(
            target.model,
            answer,
            self._litellm.ModelResponse(),
            _Unlogged(),
            rendered.data,
            rendered.messages,
            rendered.optional,
            rendered.litellm_params,
            None,
            api_key=target.api_key,
        )
        completion: Chunk = response.model_dump(exclude_none=True)
        return completion

    async def open_stream(self, target: ProviderTarget, call: UpstreamCall) -> AsyncIterator[Chunk]:
        """A stream's chunks as LiteLLM's provider iterator translates the provider's events, shaped as
        `litellm.acompletion`'s stream wrapper gives them (`_stream_chunks`); returns once the upstream has
        accepted the call."""
        rendered = self._render(target, call, stream=True)
        answer = await self._http.post(target.url, rendered.headers, orjson.dumps(rendered.data))
        if not answer.headers.get("content-type", "").startswith(EVENT_STREAM):
            await answer.aclose()
            raise malformed_answer("A stream was asked for and the upstream answered otherwise.")
        events = self._litellm.llms.anthropic.chat.handler.ModelResponseIterator(
            streaming_response=answer.aiter_lines(),
            sync_stream=False,
            json_mode=rendered.optional.get("json_mode"),
            speed=rendered.optional.get("speed"),
            tool_name_reverse_map=rendered.litellm_params.get(TOOL_NAMES_KEY),
        )
        options = call.params.get("stream_options")
        usage = isinstance(options, Mapping) and options.get("include_usage") is True
        return _stream_chunks(answer, events, self._litellm.ModelResponseStream, target.model, usage)

    def _render(self, target: ProviderTarget, call: UpstreamCall, stream: bool) -> _Rendered:
        """The provider's request for the call, as LiteLLM's handler renders it."""
        config = target.config
        sent = detached(chat_messages(call.messages))
        asked = {name: value for name, value in call.params.items() if name not in _STREAM_FIELDS}
        if stream:
            asked["stream"] = True
        optional = config.map_openai_params(asked, {}, target.model, drop_params=False)
        litellm_params: dict[str, Any] = {}  # the request's transform leaves here what its answer's needs
        headers = config.validate_environment(
            {}, target.model, sent, optional, litellm_params, api_key=target.api_key, api_base=target.url
        )
        data = config.transform_request(target.model, sent, optional, litellm_params, headers)
        if stream:
            data["stream"] = True
        return _Rendered(sent, optional, litellm_params, {**target.agent, **headers}, data)


@dataclass(frozen=True)
class _Rendered:
    messages: list[Message]
    optional: dict[str, Any]
    litellm_params: dict[str, Any]
    headers: dict[str, str]
    data: dict[str, Any]


async def _stream_chunks(
    answer: httpx.Response, events: Any, stream_type: Any, model: str, usage: bool
) -> AsyncIterator[Chunk]:
    """The iterator's chunks as `acompletion`'s stream wrapper relays them: its placeholders and empty deltas
    left out, the role on the first delta, a finishing delta without its empty content, and the usage (the
    iterator puts it on the first and last events) only in a chunk of its own at the end, when the client asked
    for it (`stream_options.include_usage`)."""
    first: Chunk | None = None
    last_usage = None
    try:
        async for event in events:
            if not isinstance(event, stream_type):
                continue  # a placeholder for an SSE line that held no data
            chunk: Chunk = event.model_dump(exclude_none=True)
            last_usage = chunk.pop("usage", None) or last_usage
            choice = chunk["choices"][0] if chunk.get("choices") else None
            if choice is None:
                continue
            delta = choice.setdefault("delta", {})
            if delta.get("content") == "" and (choice.get("finish_reason") or len(delta) == 1):
                del delta["content"]
            if not delta and not choice.get("finish_reason"):
                continue
            chunk["model"] = model
            if first is None:
                first = chunk
                delta["role"] = "assistant"
            chunk["id"], chunk["created"] = first["id"], first["created"]
            yield chunk
    finally:
        await answer.aclose()
    if usage and first is not None and last_usage is not None:
        end = {key: first[key] for key in ("id", "created", "model", "object")}
        yield {**end, "choices": [{"index": 0, "delta": {}}], "usage": last_usage}


def detached(messages: list[Message]) -> list[Message]:
    """The messages as LiteLLM may change them: some of its provider transforms rewrite a message in place, and
    the proxy's are shared with the next request of their client (`proxy.doors.resent`)."""
    try:
        copied: list[Message] = orjson.loads(orjson.dumps(messages))
    except TypeError:  # an integer past 64 bits, which orjson does not write
        copied = copy.deepcopy(messages)
    return copied
