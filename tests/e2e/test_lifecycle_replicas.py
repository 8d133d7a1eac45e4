"""A session deleted on one replica while another streams into it (two proxy processes on one PostgreSQL
database): the stream's answer is refused, and the store is left with the session wholly gone, never a
half-deleted session (no answer node, no step, no event of it); the client's next turn is stored anew, whole, at
once."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e import test_replicas
from tests.e2e.test_replicas import (
    LONG_REPLY,
    Messages,
    StartReplicas,
    as_sent,
    ask,
    long_or_echo,
    replica_config,
    sdk,
    session_path,
)
from tests.support.fake_upstream import FakeUpstream
from tests.support.postgres_server import PostgresServer
from tests.support.raw_store import committed_rows

start_replicas = test_replicas.start_replicas
"""The replicas' fixture (`start_replicas`), shared with the replica tests."""


def counts(database: str) -> dict[str, int]:
    tables = ("sessions", "messages", "journal_steps", "journal_events", "message_tokens")
    return {table: committed_rows(database, f"SELECT COUNT(*) FROM {table}")[0][0] for table in tables}


def test_a_session_deleted_on_one_replica_mid_stream_on_another_is_wholly_gone(
    tmp_path: Path, postgres: PostgresServer, fake: FakeUpstream, start_replicas: StartReplicas
) -> None:
    fake.responder = long_or_echo
    database = postgres.database()
    streaming, deleting = start_replicas(replica_config(tmp_path, fake, database), "a", "b")
    headers = {"X-Session-Id": "doomed"}
    messages: Messages = [{"role": "system", "content": "Be verbose."}, {"role": "user", "content": "hello"}]
    with sdk(streaming) as client:
        answer, _ = ask(client, "big", messages, headers)
        ask(client, "big", [messages[0], {"role": "user", "content": "another"}], {"X-Session-Id": "kept"})
    messages += [answer, {"role": "user", "content": "tell me something long"}]
    kept = counts(database)

    fake.chunk_delay_s = 0.2
    seen = ""
    with sdk(streaming) as client:
        stream = client.chat.completions.create(
            model="big", messages=cast("list[ChatCompletionMessageParam]", messages), stream=True, extra_headers=headers
        )
        with stream, pytest.raises((openai.APIError, httpx.HTTPError)):
            for chunks, chunk in enumerate(stream, 1):
                seen += "".join(choice.delta.content or "" for choice in chunk.choices)
                if chunks == 5:
                    deleted = httpx.delete(f"{deleting.url}/sessions/doomed", timeout=30)
                    assert deleted.status_code == 200, deleted.text
    fake.chunk_delay_s = 0.0
    assert seen
    assert seen != LONG_REPLY

    after = counts(database)
    assert committed_rows(database, "SELECT COUNT(*) FROM sessions WHERE id = 'doomed'") == [(0,)]
    assert committed_rows(database, "SELECT COUNT(*) FROM journal_steps WHERE session_id = 'doomed'") == [(0,)]
    assert (
        after["journal_events"]
        == committed_rows(
            database, "SELECT COUNT(*) FROM journal_events WHERE step_id IN (SELECT id FROM journal_steps)"
        )[0][0]
    )
    assert after["messages"] == after["message_tokens"] == 3  # the session `kept` alone: system, user, answer
    assert after["sessions"] == kept["sessions"] - 1

    # The client sends its turn again: the deleted id names nothing on the streaming replica either (the path it
    # remembered is gone from the store), so the turn is stored at once, whole, as a new session.
    with sdk(streaming) as client:
        answer, _ = ask(client, "big", messages, headers)
    assert answer["content"] == LONG_REPLY
    assert session_path(database, "doomed") == as_sent([*messages, answer])
