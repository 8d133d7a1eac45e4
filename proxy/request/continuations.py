"""A request that continues a stored answer (Responses' `previous_response_id`): the conversation up to it, from
the history, put before the request's own messages. The one place continuations are resolved: from the store
(`continued`), and on a WebSocket from what that socket answered or was warmed up with (`SocketContinuations`).

The answer is a journal step; the door that answered keeps with it whether it may be read back (`StepRecord.
readable_through`), so a response sent with `store: false` or deleted, another tenant's and an unknown id all
read as not found. The earlier request's instructions are left out: the new request brings its own. The result
must still pair every tool output with a call before it, as every provider requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from proxy.canonical.conversation import Conversation
from proxy.canonical.tool_pairs import unanswered_output
from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS, SYSTEM_ROLES
from proxy.compaction.client_prompts import is_acknowledgement
from proxy.errors import InvalidRequest, NotFound
from proxy.history import chain
from proxy.history.messages import StoredMessage
from proxy.history.store import History
from proxy.journal.reader import JournalReader
from proxy.request.references import References

RECENT_SESSIONS = 8
"""The tenant's most recent sessions an instructionless compaction request is compared with."""
COMPARED_MESSAGES = 4
"""How many of its first messages must be a session's first (after the instructions)."""


async def continued(
    reader: JournalReader, history: History, references: References, tenant: str, conversation: Conversation
) -> tuple[Conversation, str | None]:
    """The conversation with what it continues put in, and the session of the answer it continues (None when it
    continues nothing)."""
    continuation = conversation.continues
    if continuation is None:
        return await _summarized(history, references, tenant, conversation), None
    if continuation.message_id is not None:
        found = await history.sent_path(tenant, continuation.message_id)
        if found is None:
            raise NotFound(
                f"The conversation {continuation.reference} ({continuation.param}) stands for is not in this "
                "proxy's store.",
                param=continuation.param,
                code="compaction_not_found",
            )
        return extended(conversation, without_instructions(found[1])), None
    record = None if continuation.step_id is None else await reader.step(tenant, continuation.step_id)
    if record is None or not record.readable_through(continuation.door, unstored=continuation.same_connection):
        raise NotFound(
            f"Response with id '{continuation.reference}' not found.",
            param=continuation.param,
            code="previous_response_not_found",
        )
    if record.message_id is None:
        raise NotFound(
            f"Response '{continuation.reference}' has no answer to continue from (status {record.status}).",
            param=continuation.param,
            code="previous_response_not_found",
        )
    found = await history.sent_path(tenant, record.message_id)
    return extended(conversation, [] if found is None else without_instructions(found[1])), record.session_id


async def _summarized(
    history: History, references: References, tenant: str, conversation: Conversation
) -> Conversation:
    """A conversation whose client compacted it into a summary the proxy wrote (a user message carrying a
    reference, `proxy.request.references`): the summary and the turns the client kept before it give way to the stored
    conversation it stands for, in the form it was last sent in (so the upstream's cached prompt holds); so does a
    model turn the client wrote itself to acknowledge the summary (`client_prompts.is_acknowledgement`). A reference
    to nothing of this tenant's is left as it is."""
    found = references.find(tenant, conversation.messages)
    if found is None:
        return conversation
    index, message_id = found
    path = await history.owned_path(tenant, message_id)
    if path is None:
        return conversation
    own = conversation.messages
    leading = next((at for at, stored in enumerate(path) if stored.role not in SYSTEM_ROLES), len(path))
    system = [message for message in own[:index] if message.get("role") in SYSTEM_ROLES]
    after = own[index + 1 :]
    if after and is_acknowledgement(after[0]):
        after = after[1:]  # the client's own reply to its summary (Gemini CLI's) goes with it
    end = len(path) - kept_tail(path[leading:], after)
    forms = await history.sent_forms(tenant, path)
    messages = [*system, *forms[leading:end], *after]
    return replace(conversation, messages=messages)


def kept_tail(path: Sequence[StoredMessage], after: Sequence[Message]) -> int:
    """How many of the path's last messages the client kept after its summary, and sends again first (Pi and
    OpenCode keep their recent turns after it): the longest end of `path` that `after` starts with."""
    if not after or not path:
        return 0
    first = chain.identity(chain.normalize(after[0]))
    for start in range(max(0, len(path) - len(after)), len(path)):
        if chain.identity(path[start].message) != first:
            continue
        tail = path[start:]
        if all(
            chain.identity(stored.message) == chain.identity(chain.normalize(message))
            for stored, message in zip(tail, after, strict=False)
        ):
            return len(tail)
    return 0


async def with_instructions(history: History, tenant: str, conversation: Conversation) -> Conversation:
    """A compaction request sent without the instructions its conversation was held under (the Agents SDK's
    compaction session in `input` mode sends the session's items alone) gets those of the tenant's most recent
    session whose conversation it starts as, so that it is stored on that session's path, not as a new root (a
    second session). One with instructions, or like no recent session, is left as it is."""
    messages = conversation.messages
    if not messages or any(message.get("role") in SYSTEM_ROLES for message in messages):
        return conversation
    opening = [chain.identity(chain.normalize(message)) for message in messages[:COMPARED_MESSAGES]]
    for _session_id, head_id in await history.recent_heads(tenant, RECENT_SESSIONS):
        path = await history.path_to(head_id)
        leading = next((at for at, stored in enumerate(path) if stored.role not in SYSTEM_ROLES), len(path))
        own = [chain.identity(stored.message) for stored in path[leading : leading + len(opening)]]
        if leading and own and own == opening[: len(own)]:
            instructions = [stored.message for stored in path[:leading]]
            return replace(conversation, messages=[*instructions, *messages], instructions=leading)
    return conversation


def extended(conversation: Conversation, earlier: list[Message]) -> Conversation:
    """`earlier` (a conversation without its instructions) put between the request's instructions and its own
    messages; every tool output must still answer a call before it."""
    own = conversation.messages
    messages = [*own[: conversation.instructions], *earlier, *own[conversation.instructions :]]
    orphan = unanswered_output(messages)
    if orphan is not None:
        raise InvalidRequest(f"No tool call found for function call output with call_id {orphan}.", param="input")
    door_state = {**conversation.door_state, "input_from": conversation.instructions + len(earlier)}
    return replace(conversation, messages=messages, door_state=door_state, continues=None)


def without_instructions(forms: Sequence[Message]) -> list[Message]:
    """A continued conversation's messages (`History.sent_path`), the instructions it was asked with left out."""
    return [form for form in forms if not is_instructions(form)]


def is_instructions(message: Message) -> bool:
    """A request's `instructions` enter the conversation as a system message with no items of their own."""
    return message.get("role") in SYSTEM_ROLES and message.get(ITEMS) == []


@dataclass
class SocketContinuations:
    """What one socket remembers between its requests, as OpenAI's WebSocket mode does: a request may continue
    a response answered on the same socket even if the client did not store it, or its latest warm-up. Only the
    latest: a client warms a socket up just before the turn that continues it (Codex, every turn), and a
    warm-up may hold a whole conversation, so a socket keeps one rather than every one it was sent."""

    answered: set[int] = field(default_factory=set)
    """The journal steps answered on this socket."""
    warmed: tuple[str, Conversation] | None = None
    """The latest warm-up: the id it answered with, and the conversation it was sent with, resolved."""

    def warm(self, reference: str, conversation: Conversation) -> None:
        self.warmed = (reference, conversation)

    def resolve(self, conversation: Conversation) -> Conversation:
        continues = conversation.continues
        if continues is None:
            return conversation
        if self.warmed is not None and self.warmed[0] == continues.reference:
            warmed = self.warmed[1]
            return extended(conversation, warmed.messages[warmed.instructions :])
        if continues.step_id in self.answered:
            return replace(conversation, continues=replace(continues, same_connection=True))
        return conversation
