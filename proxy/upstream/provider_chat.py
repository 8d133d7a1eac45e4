"""Non-stream chat completions to a translated provider (Anthropic), without `litellm.acompletion`'s bookkeeping.

LiteLLM stays the provider layer: its provider config (`ProviderConfigManager`) maps the client's parameters,
gives the headers, renders the provider's request and translates its answer to OpenAI's object, as LiteLLM's
own handlers drive it. What `acompletion` adds around that per call (logging object, cost calculation, response
rebuild: ~3 ms, see bench/overhead.py) a proxy does not need. The body is posted on the direct route's pooled,
bounded client (`OpenAIChat.post`: same deadlines, retries, error cutting), and failures go through the proxy's
one boundary (`proxy.upstream.failures`) in `LiteLLMUpstream`.

Only providers whose request URL the proxy can compose as LiteLLM does take this route (`TRANSLATED_PROVIDERS`).
Streams, and every other provider (Gemini, whose URL LiteLLM's Vertex handler builds with the key in the query;
Bedrock, whose requests are SigV4-signed), stay on `litellm.acompletion`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.config import ModelEntry
from proxy.types import Chunk, Message
from proxy.upstream.bounded_bodies import EVENT_STREAM
from proxy.upstream.failures import malformed_answer
from proxy.upstream.openai_chat import OpenAIChat
from proxy.vocabulary import chat_messages

ANTHROPIC_BASE = "https://api.anthropic.com/v1/messages"
ANTHROPIC_PATH = "/v1/messages"
ANTHROPIC_BASE_VARIABLES = ("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL")
ANTHROPIC_KEY_VARIABLE = "ANTHROPIC_API_KEY"
TRANSLATED_PROVIDERS = frozenset({"anthropic"})
"""Providers posted by `ProviderChat` (non-stream); the URL rule is LiteLLM's `main.py` one for Anthropic."""
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
    """Renders, posts and translates one non-stream call; raises foreign failures for the caller's boundary."""

    def __init__(self, litellm: Any, http: OpenAIChat) -> None:
        self._litellm = litellm
        self._http = http

    async def complete(self, target: ProviderTarget, messages: list[Message], params: Mapping[str, Any]) -> Chunk:
        config = target.config
        sent = detached(chat_messages(messages))
        asked = {name: value for name, value in params.items() if name not in _STREAM_FIELDS}
        optional = config.map_openai_params(asked, {}, target.model, drop_params=False)
        headers = config.validate_environment(
            {}, target.model, sent, optional, {}, api_key=target.api_key, api_base=target.url
        )
        data = config.transform_request(target.model, sent, optional, {}, headers)
        answer = await self._http.post(target.url, {**target.agent, **headers}, orjson.dumps(data))
        try:
            if answer.headers.get("content-type", "").startswith(EVENT_STREAM):
                raise malformed_answer()
            await answer.aread()
        finally:
            await answer.aclose()
        response = config.transform_response(
            target.model,
            answer,
            self._litellm.ModelResponse(),
            _Unlogged(),
            data,
            sent,
            optional,
            {},
            None,
            api_key=target.api_key,
        )
        completion: Chunk = response.model_dump(exclude_none=True)
        return completion


def detached(messages: list[Message]) -> list[Message]:
    """The messages as LiteLLM may change them: some of its provider transforms rewrite a message in place, and
    the proxy's are shared with the next request of their client (`proxy.doors.resent`)."""
    try:
        copied: list[Message] = orjson.loads(orjson.dumps(messages))
    except TypeError:  # an integer past 64 bits, which orjson does not write
        copied = copy.deepcopy(messages)
    return copied
