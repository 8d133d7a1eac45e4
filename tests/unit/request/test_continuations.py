"""`proxy.request.continuations.continued`: a continued answer's conversation, put before the request's own.

Codex continues each answer on its socket by its id (`previous_response_id`) with only what is new: the
conversation the answer continued must come from what the process already holds, as the very objects its request
sent (so every stage after it shares them, `proxy.canonical.sharing`), not read from the store and decoded again
on every request; and, lost, read back from the store as the same values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.canonical.answers import Completed
from proxy.canonical.conversation import Conversation
from proxy.config.schema import RequestLimits
from proxy.doors.context_headers import context_options
from proxy.doors.responses.ids import response_id
from proxy.doors.responses.input import parse_responses_request
from proxy.history.caches import RecentPaths
from proxy.history.messages import StoredMessage
from proxy.store.database import Database
from tests.support.scripted_upstream import completion
from tests.unit.request.test_pipeline import MODEL, TENANT, Rig

FIRST_INPUT: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are an agent."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
]


@pytest.fixture
def rig(db: Database, tmp_path: Path) -> Rig:
    return Rig(db, tmp_path)


def responses(**body: Any) -> Conversation:
    return parse_responses_request(json.dumps({"model": MODEL, **body}).encode(), RequestLimits()).conversation


async def answered(rig: Rig) -> tuple[Conversation, str]:
    """The first request answered; the response id that continues it."""
    rig.upstream.reply(completion("Here they are."))
    first = responses(input=FIRST_INPUT)
    answer = await rig.pipeline.answer(TENANT, first, context_options({"x-session-id": "thread"}))
    assert isinstance(answer, Completed)
    return first, response_id(answer.step.id)


def counting_reads(rig: Rig) -> list[str]:
    """The ids whose paths the history reads from the store, from now on."""
    reads: list[str] = []
    path_to = rig.history.path_to

    async def counted(message_id: str, encoding: str = "") -> list[StoredMessage]:
        reads.append(message_id)
        return await (path_to(message_id, encoding) if encoding else path_to(message_id))

    rig.history.path_to = counted  # type: ignore[method-assign]
    return reads


async def test_a_continued_answer_is_the_very_messages_its_request_sent_with_nothing_read_from_the_store(
    rig: Rig,
) -> None:
    first, previous = await answered(rig)
    reads = counting_reads(rig)
    nxt = responses(input=[{"role": "user", "content": "and now?"}], previous_response_id=previous)

    continued, session = await rig.pipeline.continued(TENANT, nxt)

    assert reads == []
    assert session == "thread"
    assert all(sent is own for sent, own in zip(continued.messages, first.messages, strict=False))
    assert [message["role"] for message in continued.messages] == ["developer", "user", "assistant", "user"]
    assert continued.messages[2]["content"] == "Here they are."


async def test_the_same_continuation_read_back_from_the_store_once_the_process_forgot_its_paths(rig: Rig) -> None:
    _, previous = await answered(rig)
    nxt = responses(input=[{"role": "user", "content": "and now?"}], previous_response_id=previous)
    held, _ = await rig.pipeline.continued(TENANT, nxt)
    reads = counting_reads(rig)
    rig.history.recent = RecentPaths()  # process memory, correct to lose

    read_back, session = await rig.pipeline.continued(TENANT, nxt)

    assert len(reads) == 1
    assert session == "thread"
    assert read_back.messages == held.messages
