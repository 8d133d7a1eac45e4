"""Calls to the upstream model through LiteLLM, the provider layer: the `Upstream` the proxy runs with.

Three routes, chosen once per model entry by LiteLLM's provider resolution:

- OpenAI-compatible upstreams (LiteLLM provider `openai`: OpenAI itself, or any server at an `api_base`):
  posted straight over httpx (`proxy.upstream.openai_chat`) to the URL with the headers LiteLLM's provider
  config gives, the client's parameters as sent, the upstream's answer relayed as it came. `acompletion` costs
  ~3 ms a call more than the POST itself, and in proportion to the history above that, without changing what
  is sent (measured; see that module).
- Anthropic: rendered and translated by LiteLLM's provider config (a stream's events by its Anthropic
  iterator) and posted on the same pooled client (`proxy.upstream.provider_chat`), without `acompletion`'s
  per-call bookkeeping.
- Every other provider: `litellm.acompletion` with keyword parameters, which LiteLLM translates to the
  provider's API, and its stream wrapper, which translates the provider's chunks to OpenAI's.

Every upstream body is read bounded (`proxy.upstream.bounded_bodies`): error bodies cut, answers bounded by
`limits.max_answer_chars`. The direct route reads through `BoundedBodies` itself; so do the translated routes of
providers whose LiteLLM handler takes LiteLLM's own `AsyncHTTPHandler` (`BOUNDED_PROVIDERS`: Anthropic). Other
providers' handlers build their own clients (OpenAI-SDK ones, Bedrock's signed ones): LiteLLM reads their error
bodies whole, and there is no seam to give it ours.

Every LiteLLM, OpenAI-SDK or httpx exception is converted to an `UpstreamError` (`proxy.upstream.failures`),
with the provider keys the model lacks (`proxy.upstream.credentials`, checked once per entry) named in it.
LiteLLM is imported when the first `LiteLLMUpstream` is built, after `proxy.environment` has prepared the
process for it (`environment.litellm()`); nothing else in the proxy imports LiteLLM.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from proxy import environment
from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import chat_messages
from proxy.config.models import ModelEntry
from proxy.config.schema import DEFAULT_MAX_ANSWER_CHARS, UpstreamConfig
from proxy.errors import ProxyError, UpstreamError
from proxy.upstream.bounded_bodies import BoundedBodies, answer_too_large
from proxy.upstream.connection_retry import upstream_transport
from proxy.upstream.credentials import missing_keys, missing_keys_text, warn_missing_keys
from proxy.upstream.failures import malformed_answer, upstream_error
from proxy.upstream.openai_chat import INCOMPLETE_MESSAGE, ChatTarget, OpenAIChat
from proxy.upstream.protocol import UpstreamCall
from proxy.upstream.provider_chat import ProviderChat, ProviderTarget, detached
from proxy.upstream.redaction import NO_SECRETS, Redactor

log = logging.getLogger(__name__)

DIRECT_PROVIDERS = frozenset({"openai"})
"""Posted straight (`proxy.upstream.openai_chat`), its bodies bounded there."""
BOUNDED_PROVIDERS = frozenset({"anthropic"})
"""Translated providers whose LiteLLM handler takes our `AsyncHTTPHandler` as `client` (and so reads through
`BoundedBodies`); LiteLLM builds its own client for the others (OpenAI-SDK clients, Bedrock's signer, ...), whose
error bodies it reads whole."""
_LITELLM_ONLY_FIELDS = ("provider_specific_fields",)


@dataclass(frozen=True)
class UpstreamRoute:
    model: str
    provider: str
    direct: ChatTarget | None
    """Set for an OpenAI-compatible upstream: posted straight (`proxy.upstream.openai_chat`), not through
    `acompletion`."""
    translated: ProviderTarget | None = None
    """Set for a provider whose non-stream calls are rendered and translated by its LiteLLM provider config and
    posted straight (`proxy.upstream.provider_chat`), not through `acompletion`."""
    missing_keys: tuple[str, ...] = ()
    """Environment variables the provider reads that are unset, with no api_key in the entry to stand in."""


class LiteLLMUpstream:
    """Chat completions to any provider LiteLLM knows: OpenAI-compatible ones posted straight, others through
    `litellm.acompletion`."""

    def __init__(
        self,
        config: UpstreamConfig,
        models: tuple[ModelEntry, ...],
        redactor: Redactor = NO_SECRETS,
        max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    ) -> None:
        self._litellm = environment.litellm()
        self._max_answer_chars = max_answer_chars
        self._redactor = redactor
        self._config = config
        self._models = models
        self._direct = OpenAIChat(config, max_answer_chars)
        self._translated = ProviderChat(self._litellm, self._direct)
        self._routes = {entry.name: self._route(entry) for entry in models}

    def route(self, entry: ModelEntry) -> UpstreamRoute:
        known = self._routes.get(entry.name)
        return known if known is not None else self._route(entry)

    def warn_missing_keys(self) -> None:
        """Log a WARNING for each model whose provider key is set neither in its entry nor in the environment
        (when serving starts: a newcomer's first request would otherwise fail without saying why)."""
        for entry in self._models:
            warn_missing_keys(entry, self.route(entry).missing_keys)

    async def complete(self, call: UpstreamCall) -> Chunk:
        """A non-stream chat completion as OpenAI's JSON object (`call.native` is not looked at: this is chat)."""
        entry = call.entry
        route = self.route(entry)
        target = route.direct
        try:
            if target is not None:
                return await self._direct.complete(target, call)
            if route.translated is not None:
                return openai_json(await self._translated.complete(route.translated, call))
            response = await self._litellm.acompletion(**self._kwargs(call, stream=False))
        except Exception as exc:
            raise self._error(entry, exc) from exc
        return openai_json(response.model_dump(exclude_none=True))

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        """Start a stream; errors the upstream reports before its first byte are raised here, as a status."""
        entry = call.entry
        route = self.route(entry)
        target = route.direct
        try:
            if target is not None:
                return self._converted(entry, await self._direct.open_stream(target, call))
            if route.translated is not None:
                translated = await self._translated.open_stream(route.translated, call)
                return self._converted(entry, _chunks(translated))
            wrapper = await self._litellm.acompletion(**self._kwargs(call, stream=True))
        except Exception as exc:
            raise self._error(entry, exc) from exc
        return self._converted(entry, _chunks(_dumped(wrapper)))

    async def aclose(self) -> None:
        await self._direct.aclose()
        await environment.close_loop_clients(self._litellm)

    def _handler(self, entry: ModelEntry, stream: bool) -> Any:
        """LiteLLM's HTTP handler over `BoundedBodies`, for one upstream and one kind of call: one connection pool
        per upstream, as LiteLLM's own clients have (a call abandoned to one upstream, a summarizer cut off at
        its deadline, must not disturb the pool another's calls use). Kept in LiteLLM's own client cache, which
        keys it by event loop (an httpx client belongs to the loop that first used it) and from which `aclose`
        closes it with LiteLLM's clients."""
        cache = self._litellm.in_memory_llm_clients_cache
        kind = "stream" if stream else "json"
        name = f"context-proxy-bounded-{kind}-{self._config.timeout_s}-{entry.api_base or 'default'}"
        handler = cache.get_cache(name)
        if handler is None:
            transport = BoundedBodies(
                upstream_transport(), json_only=not stream, max_answer_chars=self._max_answer_chars
            )
            module = self._litellm.llms.custom_httpx.http_handler
            handler = module.AsyncHTTPHandler(timeout=self._config.timeout_s, transport=transport)
            cache.set_cache(name, handler, litellm_owned_client=True)
        return handler

    def model_info(self, model: str) -> Mapping[str, Any] | None:
        """LiteLLM's bundled limits for a model string, or None when it does not know the model."""
        try:
            info: Mapping[str, Any] = self._litellm.get_model_info(model)
        except (self._litellm.exceptions.ModelNotMappedError, ValueError, KeyError) as exc:
            log.debug("no LiteLLM model info for %s: %s", model, type(exc).__name__)
            return None
        return info

    async def _converted(self, entry: ModelEntry, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        """A stream whose failures after its first byte are `UpstreamError`s, as the seam promises."""
        try:
            async for chunk in chunks:
                yield chunk
        except Exception as exc:
            raise self._error(entry, exc, mid_stream=True) from exc
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()

    def _error(self, entry: ModelEntry, exc: BaseException, mid_stream: bool = False) -> ProxyError:
        too_large = answer_too_large(exc)
        if too_large is not None:
            return too_large
        names = self.route(entry).missing_keys
        hint = missing_keys_text(entry, names) if names else None
        return upstream_error(exc, mid_stream, model=entry.name, missing_keys=hint, redactor=self._redactor)

    def _kwargs(self, call: UpstreamCall, stream: bool) -> dict[str, Any]:
        entry, params = call.entry, call.params
        kwargs: dict[str, Any] = {
            "model": entry.model,
            "messages": detached(chat_messages(call.messages)),
            "timeout": self._config.timeout_s,
            "num_retries": self._config.num_retries,
            "max_retries": 0,
        }
        if entry.api_base:
            kwargs["api_base"] = entry.api_base
        if entry.api_key:
            kwargs["api_key"] = entry.api_key
        kwargs.update(params)
        kwargs["stream"] = stream
        if self.route(entry).provider in BOUNDED_PROVIDERS:
            kwargs["client"] = self._handler(entry, stream)
        if not stream:
            kwargs.pop("stream_options", None)
        if params.get("tools"):
            # LiteLLM imports its MCP server module for any tools= unless told not to; `mcp` is not installed.
            kwargs["_skip_mcp_handler"] = True
        return kwargs

    def _route(self, entry: ModelEntry) -> UpstreamRoute:
        try:
            model, provider, _key, _base = self._litellm.get_llm_provider(entry.model, api_base=entry.api_base)
        except self._litellm.exceptions.BadRequestError:
            # Unknown provider: LiteLLM will say so on the first call with the upstream's wording.
            return UpstreamRoute(entry.model, "unknown", None)
        missing = missing_keys(self._litellm, entry, provider)
        direct = ChatTarget.of(self._litellm, entry, model) if provider in DIRECT_PROVIDERS else None
        translated = ProviderTarget.of(self._litellm, entry, model, provider)
        return UpstreamRoute(model, provider, direct, translated, missing_keys=missing)


async def _dumped(wrapper: Any) -> AsyncIterator[Chunk]:
    """`acompletion`'s stream wrapper's chunks as dicts."""
    try:
        async for chunk in wrapper:
            yield chunk.model_dump(exclude_none=True)
    finally:
        await _close(wrapper)


async def _chunks(translated: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """A stream LiteLLM translated, as OpenAI chunk dicts. One that ends without a finish_reason was cut short
    (the client must hear about it, not get a short answer); one that held no chunk is malformed."""
    finished = False
    relayed = False
    try:
        async for chunk in translated:
            payload = openai_json(chunk)
            finished = finished or any(choice.get("finish_reason") for choice in payload.get("choices") or ())
            relayed = True
            yield payload
    finally:
        await translated.aclose()  # type: ignore[attr-defined]
    if not relayed:
        raise malformed_answer("The upstream's stream held no chat completion chunk.")
    if not finished:
        raise UpstreamError(
            INCOMPLETE_MESSAGE, status=502, error_type="upstream_error", code="upstream_stream_incomplete"
        )


async def _close(wrapper: Any) -> None:
    stream = getattr(wrapper, "completion_stream", None)
    response = getattr(stream, "response", None)
    aclose = getattr(response, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except (httpx.HTTPError, RuntimeError) as exc:
            log.debug("closing the upstream stream: %s", exc)


def openai_json(payload: dict[str, Any]) -> Chunk:
    """Drop the fields LiteLLM adds to OpenAI's objects, so clients receive exactly OpenAI's shape."""
    for field in _LITELLM_ONLY_FIELDS:
        payload.pop(field, None)
    for choice in payload.get("choices") or ():
        for field in _LITELLM_ONLY_FIELDS:
            choice.pop(field, None)
        for key in ("message", "delta"):
            inner = choice.get(key)
            if isinstance(inner, dict):
                for field in _LITELLM_ONLY_FIELDS:
                    inner.pop(field, None)
    return payload
