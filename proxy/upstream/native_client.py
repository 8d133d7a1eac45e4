"""A client's own API, called natively over httpx: what the Responses and Anthropic routes share.

Why not LiteLLM for these: its Responses entry point imports its MCP gateway on every call (`mcp` is not a
dependency of ours), rewrites response ids, fakes streaming for models it does not know and raises on
`response.failed` instead of passing it on (docs/research/responses.md); and both routes must relay the
upstream's events whole and send its blocks or items byte-equal. Each is one POST of JSON and its SSE answer,
so httpx (already a dependency) carries it, and the proxy's error boundary (`proxy.upstream.failures`) converts
its failures as it does LiteLLM's.

Every upstream event is kept whole in the canonical chunk the journal stores (`EVENT`), beside the chat
delta it amounts to; a non-stream answer keeps the upstream's object under `RESPONSE`. A subclass names
the URL, headers and body of its API, and converts its answers (`completion`, `converter`).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar, Protocol

import httpx

from proxy.canonical.types import Chunk, JSONObject, Message, NativeRequest
from proxy.config.models import ModelEntry
from proxy.config.schema import DEFAULT_MAX_ANSWER_CHARS, UpstreamConfig
from proxy.errors import UpstreamError
from proxy.formats.sse import DONE, sse_events
from proxy.upstream.bounded_bodies import EVENT_STREAM, BoundedBodies
from proxy.upstream.connection_retry import upstream_transport
from proxy.upstream.failures import ERROR_READ_BYTES, SHAPE_ERRORS, UpstreamRefusal, upstream_error
from proxy.upstream.protocol import UpstreamCall
from proxy.upstream.redaction import NO_SECRETS, Redactor


class EventConverter(Protocol):
    def chunk(self, event: Mapping[str, Any]) -> Chunk:
        """The canonical chunk for one upstream event; raises `UpstreamError` for a failure event."""
        ...


class NativeClient:
    """`proxy.upstream.protocol.Upstream` for the models that speak one native API (a subclass each)."""

    api: ClassVar[str]
    """The API it speaks, as a model entry's `api` and a `NativeRequest` name it (`proxy.config.models`)."""
    key_variables: ClassVar[tuple[str, ...]]
    """The environment variables its key is read from when the model entry has no `api_key`, first set first
    (the credentials check and the redactor read the same: `proxy.upstream.credentials`)."""
    ending_events: frozenset[str] = frozenset()
    """Events after which the stream is over (the rest of the connection is not waited for)."""

    def __init__(
        self, config: UpstreamConfig, redactor: Redactor = NO_SECRETS, max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS
    ) -> None:
        self._config = config
        self._max_answer_chars = max_answer_chars
        self._redactor = redactor
        self._http: httpx.AsyncClient | None = None

    def url(self, entry: ModelEntry) -> str:
        raise NotImplementedError

    def key(self, entry: ModelEntry) -> str | None:
        """The model entry's key, or the environment's."""
        return entry.api_key or next((os.environ[name] for name in self.key_variables if os.environ.get(name)), None)

    def headers(self, entry: ModelEntry, request: NativeRequest) -> dict[str, str]:
        raise NotImplementedError

    def body(self, entry: ModelEntry, request: NativeRequest, context: list[Message], stream: bool) -> JSONObject:
        """The request's own fields with `context` (the working context) in this API's form."""
        raise NotImplementedError

    def completion(self, answer: Mapping[str, Any]) -> Chunk:
        """A non-stream answer as the canonical chat.completion."""
        raise NotImplementedError

    def converter(self) -> EventConverter:
        raise NotImplementedError

    def _client(self) -> httpx.AsyncClient:
        # Made on first use, inside the event loop that uses it.
        if self._http is None:
            # Errors are read bounded here (`error_text`); answers by the transport.
            transport = BoundedBodies(
                upstream_transport(), json_only=False, max_answer_chars=self._max_answer_chars, cut_errors=False
            )
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self._config.timeout_s), transport=transport)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _request(self, call: UpstreamCall, stream: bool) -> httpx.Request:
        request = call.native
        if request is None or request.api != self.api:
            raise ValueError(f"the {self.api} client was called without a request in its API")
        body = self.body(call.entry, request, call.messages, stream)
        headers = self.headers(call.entry, request)
        return self._client().build_request("POST", self.url(call.entry), json=body, headers=headers)

    async def complete(self, call: UpstreamCall) -> Chunk:
        """A non-stream call: the canonical chat.completion, the upstream's answer whole inside it.

        An error is read only up to `ERROR_READ_BYTES`, and an event stream is refused before its body is read.
        """
        entry = call.entry
        try:
            answer = await self._client().send(self._request(call, False), stream=True)
        except httpx.HTTPError as exc:
            raise self._error(entry, exc) from exc
        try:
            if answer.status_code >= 400:
                raise self._error(entry, UpstreamRefusal(answer.status_code, await error_text(answer), answer.headers))
            if answer.headers.get("content-type", "").startswith(EVENT_STREAM):
                raise self._error(entry, json.JSONDecodeError("an event stream, not JSON", "", 0))
            await answer.aread()
            return self.completion(answer.json())
        except httpx.HTTPError as exc:
            raise self._error(entry, exc) from exc
        except (*SHAPE_ERRORS, ValueError) as exc:
            raise self._error(entry, exc) from exc
        finally:
            await answer.aclose()

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        """Start a stream; a refusal before its first byte is raised here, with the upstream's status."""
        entry = call.entry
        try:
            answer = await self._client().send(self._request(call, True), stream=True)
        except httpx.HTTPError as exc:
            raise self._error(entry, exc) from exc
        if answer.status_code >= 400:
            try:
                text = await error_text(answer)
            except httpx.HTTPError as exc:
                raise self._error(entry, exc) from exc
            finally:
                await answer.aclose()
            raise self._error(entry, UpstreamRefusal(answer.status_code, text, answer.headers))
        return self._chunks(entry, answer)

    async def _chunks(self, entry: ModelEntry, answer: httpx.Response) -> AsyncIterator[Chunk]:
        converter = self.converter()
        try:
            async for sse in sse_events(answer.aiter_lines()):
                if sse.data == DONE:
                    return
                event = sse.json()
                if not isinstance(event, dict):
                    continue
                yield converter.chunk(event)
                if event.get("type") in self.ending_events:
                    return
        except UpstreamError:
            raise
        except (httpx.HTTPError, ValueError, *SHAPE_ERRORS) as exc:
            raise self._error(entry, exc, mid_stream=True) from exc
        finally:
            await answer.aclose()

    def _error(self, entry: ModelEntry, exc: BaseException, mid_stream: bool = False) -> UpstreamError:
        return upstream_error(exc, mid_stream, model=entry.name, redactor=self._redactor)


async def error_text(answer: httpx.Response) -> str:
    """The head of an error body: at most `ERROR_READ_BYTES` are read, whatever the upstream sends."""
    parts: list[bytes] = []
    size = 0
    async for part in answer.aiter_bytes():
        parts.append(part)
        size += len(part)
        if size >= ERROR_READ_BYTES:
            break
    return b"".join(parts)[:ERROR_READ_BYTES].decode("utf-8", "replace")


def model_id(entry: ModelEntry, provider: str) -> str:
    """The model as its provider names it: the LiteLLM model string without its `provider/` prefix."""
    prefix = provider + "/"
    return entry.model[len(prefix) :] if entry.model.startswith(prefix) else entry.model
