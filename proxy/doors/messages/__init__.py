"""The Anthropic Messages door: `POST /v1/messages` (and `/count_tokens`), for Claude Code and the Anthropic SDKs.

The request is parsed into the canonical conversation (`proxy.doors.messages.input`), answered by the same
pipeline as the other doors, and rendered back as a `message` or its event stream
(`proxy.doors.messages.output`). Every error on this door leaves in Anthropic's shape with its status. The key may
come as `x-api-key` (Anthropic's SDKs) or `Authorization: Bearer`; `?beta=true` (Claude Code) is accepted.

The session is `X-Session-Id`, else Claude Code's `X-Claude-Code-Session-Id`, else derived as for chat.
`max_tokens` is lowered to what the configured model can give (`Conversation.fit_output`: its output limit, a
quarter of its window and of what the request's tools and system prompt leave of it, at most): Anthropic clients
ask for their Claude model's limit, whatever the model behind the proxy.

`count_tokens` reports what the proxy would send for the conversation (`Pipeline.count_tokens`): the request
as it stands while it fits, else about the share the proxy compacts to (`context.compact_to` of the model's
input budget). A client that auto-compacts by this number (Claude Code does, near its model's window) thus leaves the
compaction to the proxy, which keeps the whole history, instead of rewriting its own.
"""

from __future__ import annotations

from typing import ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.auth import BEARER, X_API_KEY, Caller, KeyPlace
from proxy.canonical.answers import Answer, Completed, Replayed
from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import RESPONSE
from proxy.config.schema import RequestLimits
from proxy.doors.body import parse_off_loop, request_body
from proxy.doors.context_headers import answer_headers
from proxy.doors.door import Door, DoorRequest, DoorRoute, ErrorReply, RequestView
from proxy.doors.event_streams import Event, relayed, replayed
from proxy.doors.messages.input import parse_messages_request
from proxy.doors.messages.output import MessageEvents, MessageShape, anthropic_error, completed_message
from proxy.doors.sse import RelayedStream, sse_response
from proxy.observability.requests import observe_model

BETA_HEADER = "anthropic-beta"


class Messages(Door[None]):
    name: ClassVar[str] = "messages"
    paths: ClassVar[tuple[str, ...]] = ("/v1/messages",)
    mounts: ClassVar[tuple[str, ...]] = ("/v1/messages",)
    keys: ClassVar[tuple[KeyPlace, ...]] = (BEARER, X_API_KEY)
    session_header: ClassVar[str | None] = "x-claude-code-session-id"
    native_headers: ClassVar[tuple[str, ...]] = (BETA_HEADER,)
    routes: ClassVar[tuple[DoorRoute, ...]] = (DoorRoute("/v1/messages/count_tokens", ("POST",), "count_tokens"),)

    def parse(self, request: RequestView, limits: RequestLimits, tenant: str) -> DoorRequest[None]:
        return DoorRequest(parse_messages_request(request.body, limits, self.resent.of(tenant)), None)

    def render(self, answer: Answer, request: DoorRequest[None]) -> Response:
        conversation = request.conversation
        shape = MessageShape(answer.step.id, conversation.model, answer.report.prompt_tokens)
        headers = answer_headers(answer)
        if isinstance(answer, Completed | Replayed):
            completion = answer.response if isinstance(answer, Completed) else answer.chunks[0]
            if isinstance(answer, Completed) or not conversation.stream:
                return JSONResponse(_message_object(shape, completion), headers=headers)
            return sse_response(replayed(MessageEvents(shape), answer.chunks), headers)
        return RelayedStream(answer.groups, relayed(MessageEvents(shape), answer.groups), headers)

    @staticmethod
    def error(exc: BaseException) -> ErrorReply:
        return anthropic_error(exc)

    async def count_tokens(self, request: Request, caller: Caller) -> Response:
        """`POST /v1/messages/count_tokens`: what the proxy would send (see the module docstring)."""
        limits = self.config.request_limits
        raw = await request_body(request, self.config, earlier=self.resent.earlier(caller.tenant))
        conversation = await parse_off_loop(
            raw,
            lambda raw: parse_messages_request(raw, limits, self.resent.of(caller.tenant), counting=True),
            self.lane,
        )
        observe_model(request.scope, conversation.model)
        return JSONResponse({"input_tokens": await self.pipeline.count_tokens(conversation)})


def _message_object(shape: MessageShape, completion: Chunk) -> Event:
    """The `message` a non-stream answer is: an Anthropic upstream's own (under the proxy's id), or rendered."""
    native = completion.get(RESPONSE)
    return {**native, "id": shape.id} if isinstance(native, dict) else completed_message(shape, completion)
