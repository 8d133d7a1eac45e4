"""Calls to the upstream model through LiteLLM: the `Upstream` the proxy runs with.

Two routes, chosen once per model entry (measured; see the closing notes of the foundation issue):

- OpenAI-compatible upstreams (LiteLLM provider `openai`: OpenAI itself, or any server at an `api_base`):
  LiteLLM's httpx handler (see environment.py), with every client parameter in `extra_body` so it reaches the
  upstream exactly as sent (LiteLLM drops `user` and `metadata` and rejects some parameters by model name when
  they are passed as keywords). Streams are read from the handler's parsed chunks (`completion_stream`)
  instead of through `CustomStreamWrapper`, which rebuilds every chunk (~300 µs per chunk against ~40 µs) and
  replaces the upstream's `created` and the usage chunk's `choices: []`.
- Every other provider: keyword parameters, which LiteLLM translates to the provider's API, and the stream
  wrapper, which translates the provider's chunks to OpenAI's.

The pass-through route, and the translated routes of providers whose LiteLLM handler takes LiteLLM's own
`AsyncHTTPHandler` (`BOUNDED_PROVIDERS`: Anthropic), get an httpx client over `BoundedBodies`
(`proxy.upstream.bounded_bodies`): error bodies cut before LiteLLM's passes over them, answers bounded by
`limits.max_answer_chars`. Other providers' handlers build their own clients (OpenAI-SDK ones, Bedrock's signed
ones): LiteLLM reads their error bodies whole, and there is no seam to give it ours.

Every LiteLLM, OpenAI-SDK or httpx exception is converted to an `UpstreamError` (`proxy.upstream.failures`),
with the provider keys the model lacks (`proxy.upstream.credentials`, checked once per entry) named in it.
LiteLLM is imported when the first `LiteLLMUpstream` is built, after `proxy.environment` has prepared the
process for it (`environment.litellm()`); nothing else in the proxy imports LiteLLM.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from proxy import environment
from proxy.config import DEFAULT_MAX_ANSWER_CHARS, ModelEntry, UpstreamConfig
from proxy.errors import ProxyError, UpstreamError
from proxy.types import Chunk, Message
from proxy.upstream.bounded_bodies import BoundedBodies, answer_too_large
from proxy.upstream.credentials import missing_keys, missing_keys_text, warn_missing_keys
from proxy.upstream.failures import malformed_answer, upstream_error
from proxy.upstream.redaction import NO_SECRETS, Redactor
from proxy.vocabulary import chat_messages

log = logging.getLogger(__name__)

KEYWORD_PARAMS = frozenset({"stream", "stream_options"})
"""Parameters LiteLLM must see itself even on the pass-through route (it drives the stream with them)."""

DIRECT_PROVIDERS = frozenset({"openai"})
BOUNDED_PROVIDERS = frozenset({"openai", "anthropic"})
"""Providers whose LiteLLM handler takes our `AsyncHTTPHandler` as `client` (and so reads through
`BoundedBodies`); LiteLLM builds its own client for the others (OpenAI-SDK clients, Bedrock's signer, ...), whose
error bodies it reads whole."""
_LITELLM_ONLY_FIELDS = ("provider_specific_fields",)


@dataclass(frozen=True)
class UpstreamRoute:
    model: str
    provider: str
    passthrough: bool
    """True: OpenAI wire format end to end, parameters in extra_body, raw parsed chunks."""
    missing_keys: tuple[str, ...] = ()
    """Environment variables the provider reads that are unset, with no api_key in the entry to stand in."""


class LiteLLMUpstream:
    """Chat completions through `litellm.acompletion`, to any provider LiteLLM knows."""

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
        self._routes = {entry.name: self._route(entry) for entry in models}

    def route(self, entry: ModelEntry) -> UpstreamRoute:
        known = self._routes.get(entry.name)
        return known if known is not None else self._route(entry)

    def warn_missing_keys(self) -> None:
        """Log a WARNING for each model whose provider key is set neither in its entry nor in the environment
        (when serving starts: a newcomer's first request would otherwise fail without saying why)."""
        for entry in self._models:
            warn_missing_keys(entry, self.route(entry).missing_keys)

    async def complete(self, entry: ModelEntry, messages: list[Message], params: Mapping[str, Any]) -> Chunk:
        """A non-stream chat completion as OpenAI's JSON object."""
        try:
            response = await self._litellm.acompletion(**self._kwargs(entry, messages, params, stream=False))
        except Exception as exc:
            raise self._error(entry, exc) from exc
        return openai_json(response.model_dump(exclude_none=True))

    async def open_stream(
        self, entry: ModelEntry, messages: list[Message], params: Mapping[str, Any]
    ) -> AsyncIterator[Chunk]:
        """Start a stream; errors the upstream reports before its first byte are raised here, as a status."""
        route = self.route(entry)
        try:
            wrapper = await self._litellm.acompletion(**self._kwargs(entry, messages, params, stream=True))
            if route.passthrough and wrapper.completion_stream is None:
                await wrapper.fetch_stream()
        except Exception as exc:
            raise self._error(entry, exc) from exc
        failure = functools.partial(self._error, entry, mid_stream=True)
        if route.passthrough:
            return _chunks(wrapper.completion_stream, wrapper, failure)
        return _chunks(wrapper, wrapper, failure)

    async def aclose(self) -> None:
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
                httpx.AsyncHTTPTransport(), json_only=not stream, max_answer_chars=self._max_answer_chars
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

    def _error(self, entry: ModelEntry, exc: BaseException, mid_stream: bool = False) -> ProxyError:
        too_large = answer_too_large(exc)
        if too_large is not None:
            return too_large
        names = self.route(entry).missing_keys
        hint = missing_keys_text(entry, names) if names else None
        return upstream_error(exc, mid_stream, model=entry.name, missing_keys=hint, redactor=self._redactor)

    def _kwargs(
        self, entry: ModelEntry, messages: list[Message], params: Mapping[str, Any], stream: bool
    ) -> dict[str, Any]:
        route = self.route(entry)
        kwargs: dict[str, Any] = {
            "model": entry.model,
            "messages": chat_messages(messages),
            "stream": stream,
            "timeout": self._config.timeout_s,
            "num_retries": self._config.num_retries,
            "max_retries": 0,
        }
        if entry.api_base:
            kwargs["api_base"] = entry.api_base
        if entry.api_key:
            kwargs["api_key"] = entry.api_key
        if stream and params.get("stream_options") is not None:
            kwargs["stream_options"] = params["stream_options"]
        rest = {key: value for key, value in params.items() if key not in KEYWORD_PARAMS}
        if route.provider in BOUNDED_PROVIDERS:
            kwargs["client"] = self._handler(entry, stream)
        if route.passthrough:
            if rest:
                kwargs["extra_body"] = rest
        else:
            kwargs.update(rest)
            if rest.get("tools"):
                # LiteLLM imports its MCP server module for any tools= unless told not to; `mcp` is not installed.
                kwargs["_skip_mcp_handler"] = True
        return kwargs

    def _route(self, entry: ModelEntry) -> UpstreamRoute:
        try:
            model, provider, _key, _base = self._litellm.get_llm_provider(entry.model, api_base=entry.api_base)
        except self._litellm.exceptions.BadRequestError:
            # Unknown provider: LiteLLM will say so on the first call with the upstream's wording.
            return UpstreamRoute(entry.model, "unknown", passthrough=False)
        missing = missing_keys(self._litellm, entry, provider)
        return UpstreamRoute(model, provider, passthrough=provider in DIRECT_PROVIDERS, missing_keys=missing)


async def _chunks(source: Any, wrapper: Any, failure: Callable[[BaseException], ProxyError]) -> AsyncIterator[Chunk]:
    """The stream as OpenAI chunk dicts; a failure after the first chunk is raised as an UpstreamError.

    The pass-through handler reports `[DONE]` as a dict marker and reports a line it cannot parse as an empty
    dict, so a stream cut short or corrupted would look complete: one that ends with neither `[DONE]` nor a
    finish_reason is a failure the client must hear about, not a short answer, and one that held no chunk at
    all (lines that are not JSON, then `[DONE]`) is not an empty answer but a malformed one. A chunk of the
    wrong shape makes LiteLLM raise a Python error: the boundary reports it as malformed, not by its text.
    """
    finished = False
    relayed = False
    try:
        async for chunk in source:
            if isinstance(chunk, dict):
                if chunk.get("is_finished") and (finished or not relayed):
                    # `[DONE]` after the answer's finish_reason: nothing an upstream sends after it is relayed.
                    # (LiteLLM reports any line containing "[DONE]" so, hence only after the finish.)
                    break
                finished = finished or bool(chunk.get("is_finished"))
                continue
            payload = openai_json(chunk.model_dump(exclude_none=True))
            finished = finished or any(choice.get("finish_reason") for choice in payload.get("choices") or ())
            relayed = True
            yield payload
    except Exception as exc:
        raise failure(exc) from exc
    finally:
        await _close(wrapper)
    if not relayed:
        raise malformed_answer("The upstream's stream held no chat completion chunk (its lines are not JSON).")
    if not finished:
        raise UpstreamError(
            "The upstream stream ended before it was complete (no [DONE], malformed or truncated events).",
            status=502,
            error_type="upstream_error",
            code="upstream_stream_incomplete",
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
