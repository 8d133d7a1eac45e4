"""Calls to the upstream model through LiteLLM, and the boundary where its exceptions become ours.

Two routes, chosen once per model entry (measured; see the closing notes of the foundation issue):

- OpenAI-compatible upstreams (LiteLLM provider `openai`: OpenAI itself, or any server at an `api_base`):
  LiteLLM's httpx handler (see environment.py), with every client parameter in `extra_body` so it reaches the
  upstream exactly as sent (LiteLLM drops `user` and `metadata` and rejects some parameters by model name when
  they are passed as keywords). Streams are read from the handler's parsed chunks (`completion_stream`)
  instead of through `CustomStreamWrapper`, which rebuilds every chunk (~300 µs per chunk against ~40 µs) and
  replaces the upstream's `created` and the usage chunk's `choices: []`.
- Every other provider: keyword parameters, which LiteLLM translates to the provider's API, and the stream
  wrapper, which translates the provider's chunks to OpenAI's.

Every LiteLLM, OpenAI-SDK or httpx exception is converted here to an `UpstreamError` carrying the upstream's
own status, message, type, code and Retry-After; nothing else in the proxy imports LiteLLM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from proxy import environment
from proxy.config import ModelEntry, UpstreamConfig
from proxy.errors import UpstreamError

environment.prepare()

import litellm  # noqa: E402  -- must follow the environment set-up above
import openai  # noqa: E402

log = logging.getLogger(__name__)

litellm.suppress_debug_info = True
litellm.disable_hf_tokenizer_download = True
# LiteLLM's default aiohttp transport discards data it had already received when the connection breaks
# before it is read (aiohttp's StreamReader raises its stored error first): chunks the upstream sent and we
# were about to journal would be lost. httpx hands them over, then raises.
litellm.disable_aiohttp_transport = True

Chunk = dict[str, Any]

KEYWORD_PARAMS = frozenset({"stream", "stream_options"})
"""Parameters LiteLLM must see itself even on the pass-through route (it drives the stream with them)."""

UPSTREAM_ERROR_PREFIX = "Exception - "
DIRECT_PROVIDERS = frozenset({"openai"})
MAX_CAUSE_DEPTH = 16
_LITELLM_ONLY_FIELDS = ("provider_specific_fields",)


@dataclass(frozen=True)
class Route:
    model: str
    provider: str
    passthrough: bool
    """True: OpenAI wire format end to end, parameters in extra_body, raw parsed chunks."""


class Upstream:
    def __init__(self, config: UpstreamConfig, models: tuple[ModelEntry, ...]) -> None:
        self._config = config
        self._routes = {entry.name: _route(entry) for entry in models}

    def route(self, entry: ModelEntry) -> Route:
        return self._routes[entry.name]

    async def complete(self, entry: ModelEntry, messages: list[dict[str, Any]], params: Mapping[str, Any]) -> Chunk:
        """A non-stream chat completion as OpenAI's JSON object."""
        try:
            response = await litellm.acompletion(**self._kwargs(entry, messages, params, stream=False))
        except Exception as exc:
            raise upstream_error(exc) from exc
        return openai_json(response.model_dump(exclude_none=True))

    async def open_stream(
        self, entry: ModelEntry, messages: list[dict[str, Any]], params: Mapping[str, Any]
    ) -> AsyncIterator[Chunk]:
        """Start a stream; errors the upstream reports before its first byte are raised here, as a status."""
        route = self.route(entry)
        try:
            wrapper = await litellm.acompletion(**self._kwargs(entry, messages, params, stream=True))
            if route.passthrough and wrapper.completion_stream is None:
                await wrapper.fetch_stream()
        except Exception as exc:
            raise upstream_error(exc) from exc
        if route.passthrough:
            return _chunks(wrapper.completion_stream, wrapper)
        return _chunks(wrapper, wrapper)

    def model_info(self, model: str) -> Mapping[str, Any] | None:
        """LiteLLM's bundled limits for a model string, or None when it does not know the model."""
        try:
            info: Mapping[str, Any] = litellm.get_model_info(model)
        except (litellm.exceptions.ModelNotMappedError, ValueError, KeyError) as exc:
            log.debug("no LiteLLM model info for %s: %s", model, type(exc).__name__)
            return None
        return info

    def _kwargs(
        self, entry: ModelEntry, messages: list[dict[str, Any]], params: Mapping[str, Any], stream: bool
    ) -> dict[str, Any]:
        route = self.route(entry)
        kwargs: dict[str, Any] = {
            "model": entry.model,
            "messages": messages,
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
        if route.passthrough:
            if rest:
                kwargs["extra_body"] = rest
        else:
            kwargs.update(rest)
            if rest.get("tools"):
                # LiteLLM imports its MCP server module for any tools= unless told not to; `mcp` is not installed.
                kwargs["_skip_mcp_handler"] = True
        return kwargs


def _route(entry: ModelEntry) -> Route:
    try:
        model, provider, _key, _base = litellm.get_llm_provider(entry.model, api_base=entry.api_base)
    except litellm.exceptions.BadRequestError:
        # Unknown provider: LiteLLM will say so on the first call with the upstream's wording.
        return Route(entry.model, "unknown", passthrough=False)
    return Route(model, provider, passthrough=provider in DIRECT_PROVIDERS)


async def _chunks(source: Any, wrapper: Any) -> AsyncIterator[Chunk]:
    """The stream as OpenAI chunk dicts; a failure after the first chunk is raised as an UpstreamError.

    The pass-through handler reports `[DONE]` as a dict marker and silently skips lines it cannot parse, so a
    stream cut short or corrupted would look complete: one that ends with neither `[DONE]` nor a finish_reason
    is a failure the client must hear about, not a short answer.
    """
    finished = False
    try:
        async for chunk in source:
            if isinstance(chunk, dict):
                finished = finished or bool(chunk.get("is_finished"))
                continue
            payload = openai_json(chunk.model_dump(exclude_none=True))
            finished = finished or any(choice.get("finish_reason") for choice in payload.get("choices") or ())
            yield payload
    except Exception as exc:
        raise upstream_error(exc, mid_stream=True) from exc
    finally:
        await _close(wrapper)
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


def upstream_error(exc: BaseException, mid_stream: bool = False) -> UpstreamError:
    """The one conversion of a foreign exception from an upstream call into the error the client sees."""
    if isinstance(exc, UpstreamError):
        return exc
    log.debug("upstream call failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    if isinstance(exc, litellm.exceptions.Timeout | httpx.TimeoutException | openai.APITimeoutError):
        return UpstreamError(
            "The upstream model did not answer in time.",
            status=504,
            error_type="timeout",
            code="upstream_timeout",
        )
    status = getattr(exc, "status_code", None)
    message = str(getattr(exc, "message", None) or exc)
    body = _upstream_body(message)
    if _is_connection_failure(exc, body):
        return UpstreamError(
            "The upstream model could not be reached" + (" (the connection broke mid-stream)." if mid_stream else "."),
            status=502,
            error_type="upstream_error",
            code="upstream_unreachable",
        )
    if not isinstance(status, int) or not 400 <= status <= 599:
        status = 502
    headers = {}
    retry_after = _retry_after(exc)
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    error = body.get("error") if isinstance(body.get("error"), dict) else None
    if error is None:
        return UpstreamError(_strip_prefixes(message), status=status, error_type=_default_type(status), headers=headers)
    return UpstreamError(
        str(error.get("message") or _strip_prefixes(message)),
        status=status,
        error_type=str(error.get("type") or _default_type(status)),
        code=None if error.get("code") is None else str(error["code"]),
        param=None if error.get("param") is None else str(error["param"]),
        headers=headers,
    )


def _upstream_body(message: str) -> dict[str, Any]:
    """LiteLLM's httpx route keeps the upstream's JSON error only inside its message text."""
    start = message.find("{", max(message.find(UPSTREAM_ERROR_PREFIX), 0))
    if start < 0:
        return {}
    try:
        body, _end = json.JSONDecoder().raw_decode(message[start:])
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _is_connection_failure(exc: BaseException, body: Mapping[str, Any]) -> bool:
    """True when no upstream answered at all. LiteLLM wraps any failure of its own as APIConnectionError or
    InternalServerError, so the class says nothing: a transport error must be somewhere in the cause chain."""
    return not body and any(isinstance(cause, httpx.TransportError | OSError) for cause in _causes(exc))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < MAX_CAUSE_DEPTH:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _retry_after(exc: BaseException) -> str | None:
    for headers in (getattr(exc, "litellm_response_headers", None), getattr(exc, "headers", None)):
        if headers is None:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value:
            return str(value)
    return None


def _strip_prefixes(message: str) -> str:
    """`litellm.RateLimitError: RateLimitError: OpenAIException - text` → `text`."""
    index = message.rfind(UPSTREAM_ERROR_PREFIX)
    if index >= 0:
        message = message[index + len(UPSTREAM_ERROR_PREFIX) :]
    if message.startswith("litellm."):
        message = message.split(": ", 1)[-1]
    return message.strip() or "The upstream model failed."


def _default_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"
