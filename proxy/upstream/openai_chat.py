"""Chat completions to an OpenAI-compatible upstream, posted straight over httpx: the proxy's hot path.

`litellm.acompletion` costs ~3 ms a call more than the POST itself, and in proportion to the history above that
(profiled under bench/overhead.py: its logging object, cost calculation, response-model rebuild, a recursive
walk and a second JSON dump of every message, run partly on the thread pool). For LiteLLM's `openai` provider
(OpenAI itself, or any server at an `api_base`) none of it changes what is sent: the body is the client's own
fields with the working context, the answer is the upstream's JSON, relayed as it came. LiteLLM stays the
provider layer: its provider resolution picks this route (`LiteLLMUpstream`), and its provider config gives the
URL and headers (`ChatTarget.of`, once per model entry); every other provider still goes through
`litellm.acompletion`. Failures go through the proxy's one boundary (`proxy.upstream.failures`), as the native
clients' do; a refusal is retried `num_retries` times (429, 5xx, a connection that failed), as LiteLLM did.

One connection pool per upstream and event loop (a summarizer's abandoned call to one upstream must not disturb
another's pool; an httpx client belongs to the loop that first used it).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import chat_messages
from proxy.config.models import ModelEntry
from proxy.config.schema import DEFAULT_MAX_ANSWER_CHARS, UpstreamConfig
from proxy.errors import AnswerTooLarge, UpstreamError
from proxy.formats.sse import DONE, SSEEvent, sse_events
from proxy.upstream.bounded_bodies import EVENT_STREAM, BoundedBodies
from proxy.upstream.connection_retry import upstream_transport
from proxy.upstream.failures import SHAPE_ERRORS, UpstreamRefusal, malformed_answer
from proxy.upstream.json_body import client_run, json_body
from proxy.upstream.native_client import error_text
from proxy.upstream.protocol import UpstreamCall
from proxy.upstream.redaction import CUT_MARK

OPENAI_BASE = "https://api.openai.com/v1"
BASE_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_BASE")
KEY_VARIABLE = "OPENAI_API_KEY"
RETRIED_STATUSES = frozenset({408, 409, 429})
"""Besides every 5xx: the statuses LiteLLM (and the OpenAI SDK) retry."""
ERROR_KEPT_CHARS = 8 * 1024
"""The most of an error body kept (then marked as cut): the step stores the error whole, its JSON around the
message, within `redaction.MAX_TEXT_CHARS`."""
INCOMPLETE_MESSAGE = "The upstream stream ended before it was complete (no [DONE], malformed or truncated events)."
NO_CHUNK_MESSAGE = "The upstream's stream held no chat completion chunk (its lines are not JSON)."
DRAIN_AFTER_DONE_S = 0.05
DRAIN_AFTER_DONE_EVENTS = 8
"""What the end of a stream is read for after `[DONE]`, so that its connection is kept (see `_drain`)."""


@dataclass(frozen=True)
class _Pool:
    """One upstream's connections on one event loop, and what every request to it carries."""

    loop: asyncio.AbstractEventLoop
    client: httpx.AsyncClient
    """Its default headers and timeout are the requests'; it closes the transport."""
    transport: httpx.AsyncBaseTransport
    url: httpx.URL
    extensions: dict[str, Any]


@dataclass(frozen=True)
class ChatTarget:
    """Where and how a model entry's calls are posted: resolved once, by LiteLLM's provider config."""

    url: str
    headers: Mapping[str, str] = field(repr=False)
    """Its key among them."""
    model: str

    @classmethod
    def of(cls, litellm: Any, entry: ModelEntry, model: str) -> ChatTarget:
        config = litellm.ProviderConfigManager.get_provider_chat_config(
            model=model, provider=litellm.LlmProviders.OPENAI
        )
        base = entry.api_base or next(
            (os.environ[name] for name in BASE_VARIABLES if os.environ.get(name)), OPENAI_BASE
        )
        key = entry.api_key or os.environ.get(KEY_VARIABLE) or None
        url = config.get_complete_url(base, key, model, {}, {})
        headers = config.validate_environment({}, model, [], {}, {}, api_key=key, api_base=base)
        return cls(url, dict(headers), model)


class OpenAIChat:
    """Posts chat completions to `ChatTarget`s; raises foreign failures for the caller's boundary to convert."""

    def __init__(self, config: UpstreamConfig, max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS) -> None:
        self._config = config
        self._max_answer_chars = max_answer_chars
        self._tls = httpx.create_ssl_context()
        """Loading the CA bundle costs ~0.2 s: once, when serving starts, not in a request's first-byte time."""
        self._pools: dict[str, _Pool] = {}
        self._headers: dict[tuple[str, tuple[tuple[str, str], ...]], httpx.Headers] = {}
        """Each target's request headers, the client's defaults merged with its own once."""

    async def complete(self, target: ChatTarget, call: UpstreamCall) -> Chunk:
        answer = await self._send(target, call, stream=False)
        try:
            if answer.headers.get("content-type", "").startswith(EVENT_STREAM):
                raise malformed_answer()
            await answer.aread()
            completion = json.loads(answer.content)
        finally:
            await answer.aclose()
        if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
            raise malformed_answer()
        return completion

    async def open_stream(self, target: ChatTarget, call: UpstreamCall) -> AsyncIterator[Chunk]:
        return _chunks(await self._send(target, call, stream=True))

    async def aclose(self) -> None:
        pools = list(self._pools.values())
        self._pools.clear()
        for pool in pools:
            if pool.loop is asyncio.get_running_loop():
                await pool.client.aclose()

    async def _send(self, target: ChatTarget, call: UpstreamCall, stream: bool) -> httpx.Response:
        fields = {**call.params, "model": target.model, "stream": stream}
        if not stream:
            fields.pop("stream_options", None)
        pool = self._pool(target.url)
        # The client's own run keeps its place and objects when the proxy's keys are stripped before it.
        raw = call.raw
        run = client_run(call.messages, raw)
        body = json_body(fields, chat_messages(call.messages, run), raw, run)
        return await self._post(pool, self._request_headers(pool, target), body)

    async def post(self, url: str, headers: Mapping[str, str], content: bytes) -> httpx.Response:
        """POST a rendered body on the pooled client of `url`, retried as LiteLLM retries; a refusal raised as
        `UpstreamRefusal` with its error body cut. The translated providers' route (`provider_chat`): their
        headers depend on each call's body, so they are merged with the client's per call."""
        pool = self._pool(url)
        merged = httpx.Headers(pool.client.headers)
        merged.update(headers)
        return await self._post(pool, merged, content)

    async def _post(self, pool: _Pool, headers: httpx.Headers, content: bytes) -> httpx.Response:
        attempts = self._config.num_retries + 1
        for attempt in range(1, attempts + 1):
            # Built as the client would (its headers and timeout) and sent straight on its transport: what
            # `client.send` adds an API proxy never uses (authentication and redirect handling, event hooks), or
            # must not (a cookie jar fed by every answer and sent with every tenant's next request). ~0.15 ms of
            # CPU a call.
            request = httpx.Request("POST", pool.url, content=content, headers=headers, extensions=pool.extensions)
            try:
                answer = await pool.transport.handle_async_request(request)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                if attempt < attempts:
                    continue
                raise
            answer.request = request
            if answer.status_code < 400:
                return answer
            try:
                text = await error_text(answer)
            finally:
                await answer.aclose()
            if len(text) > ERROR_KEPT_CHARS:
                text = text[:ERROR_KEPT_CHARS] + CUT_MARK
            if attempt < attempts and (answer.status_code >= 500 or answer.status_code in RETRIED_STATUSES):
                continue
            raise UpstreamRefusal(answer.status_code, text, answer.headers)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _request_headers(self, pool: _Pool, target: ChatTarget) -> httpx.Headers:
        key = (target.url, tuple(target.headers.items()))
        headers = self._headers.get(key)
        if headers is None:
            headers = self._headers[key] = httpx.Headers(pool.client.headers)
            headers.update(target.headers)
        return headers

    def _pool(self, url: str) -> _Pool:
        loop = asyncio.get_running_loop()
        known = self._pools.get(url)
        if known is not None and known.loop is loop:
            return known
        # Answers bounded by `limits.max_answer_chars` (a non-stream body whole, a stream per line); error bodies
        # are cut here, by `_send`.
        transport = BoundedBodies(
            upstream_transport(verify=self._tls),
            json_only=False,
            max_answer_chars=self._max_answer_chars,
            cut_errors=False,
        )
        timeout = httpx.Timeout(self._config.timeout_s)
        client = httpx.AsyncClient(timeout=timeout, transport=transport)
        pool = self._pools[url] = _Pool(loop, client, transport, httpx.URL(url), {"timeout": timeout.as_dict()})
        return pool


async def _chunks(answer: httpx.Response) -> AsyncIterator[Chunk]:
    """The stream's chunks as the upstream sent them. One that ends with neither `[DONE]` nor a finish_reason
    was cut short (the client must hear so), one that held no chunk is malformed; nothing after `[DONE]` is
    relayed. An `error` event mid-stream is the upstream's refusal, with the status it names or 502."""
    finished = False
    relayed = False
    events = sse_events(answer.aiter_lines())
    try:
        async for event in events:
            data = event.data
            if data == DONE:
                finished = True
                await _drain(events)
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                continue  # a line that is not JSON is no chunk: the stream ends incomplete, or holds none
            if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):
                status = chunk["error"].get("code")
                raise UpstreamRefusal(status if isinstance(status, int) and 400 <= status <= 599 else 502, data)
            if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
                raise malformed_answer()
            finished = finished or any(isinstance(c, dict) and c.get("finish_reason") for c in chunk["choices"])
            relayed = True
            yield chunk
    except SHAPE_ERRORS as exc:
        raise malformed_answer() from exc
    finally:
        await answer.aclose()
    if not relayed:
        raise malformed_answer(NO_CHUNK_MESSAGE)
    if not finished:
        raise UpstreamError(
            INCOMPLETE_MESSAGE, status=502, error_type="upstream_error", code="upstream_stream_incomplete"
        )


async def _drain(events: AsyncIterator[SSEEvent]) -> None:
    """Read the stream's end after `[DONE]` (the chunked body's last chunk), so its connection goes back to the
    pool: a response closed before its end closes the connection, and the next stream would pay for a new one
    before its first chunk. Nothing read here is relayed or stored; an upstream that sends more than a few events
    after `[DONE]`, or does not end its body at once, is cut off (its connection closed), and any failure of
    what follows `[DONE]` changes nothing of the answer."""
    try:
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            for _ in range(DRAIN_AFTER_DONE_EVENTS):
                await anext(events)
    except (StopAsyncIteration, TimeoutError, httpx.HTTPError, AnswerTooLarge):
        pass
