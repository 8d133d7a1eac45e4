"""Replicas: two proxy processes on one PostgreSQL database, both on the fake upstream, driven with the OpenAI SDK.

A session's turns may land on either replica (a round-robin load balancer), so what one process wrote the other
must find, and what both do at once must not be done twice: one session whose stored path is exactly what the
client sent, no summary written twice for the same range, no summarizer call whose work is thrown away, no error
under load, and a replica killed mid-stream leaves a journal holding at least what its client saw, settled once
by a survivor. Each test gets a fresh database (`postgres.database()`) and its own replicas (`ProxyProcess`: real
processes, so that a SIGKILL is real). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from proxy.budget.shared_corrections import REFRESH_S
from tests.support import proxy_server
from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.postgres_server import PostgresServer
from tests.support.proxy_server import ProxyProcess, make_config
from tests.support.raw_store import committed_rows
from tests.support.scripted_session import (
    USER_WORDS,
    assemble,
    filler,
    install_responder,
    is_summarizer_request,
    seeded,
)

SMALL_WINDOW = 4096
BIG_WINDOW = 32768
MAX_OUTPUT = 512
SMALL_BUDGET = 3379
"""4096 − 512 reserved output − ⌈5 % of 4096⌉ safety margin (as in test_compaction_e2e)."""
SUMMARIZER_MODEL_ID = "fake-summarizer"
PROCESS_START_TIMEOUT_S = 60.0
"""A replica imports LiteLLM (seconds of CPU); two start at once on a busy machine."""
TIMEOUT_S = 30.0
SETTLE_S = 15.0
"""Longer than a replica's sweep interval (`proxy.journal.owners.HEARTBEAT_S`)."""
POLL_S = 0.1
SLOW_SUMMARIZER_S = 1.0
SWEEP_GRACE_S = 0.5
"""How long a sweep may take after its heartbeat is visible."""
RECOVERY_LINE = re.compile(r"journal recovery: (\{.*?\}), (\d+) ended elsewhere")

Messages = list[dict[str, Any]]
StartReplicas = Callable[..., list[ProxyProcess]]


def model_entries(url: str) -> list[dict[str, Any]]:
    common = {"model": "openai/fake-model", "api_base": url, "api_key": "sk-x", "max_output": MAX_OUTPUT}
    return [
        {"name": "small", **common, "context_window": SMALL_WINDOW},
        {"name": "big", **common, "context_window": BIG_WINDOW},
        {"name": "summarizer", **common, "model": f"openai/{SUMMARIZER_MODEL_ID}", "context_window": SMALL_WINDOW},
    ]


def replica_config(tmp_path: Path, fake: FakeUpstream, database: str, **context: Any) -> dict[str, Any]:
    """One config for every replica: the shared database, the three models, `context` added to its section."""
    return make_config(
        tmp_path,
        fake.url,
        store={"url": database, "pool_size": 10},
        models=model_entries(fake.url),
        context={"summarizer_model": "summarizer", **context},
        upstream={"timeout_s": TIMEOUT_S},
    )


@pytest.fixture
def start_replicas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StartReplicas]:
    """Start replicas (each in a folder of its own, for its config and log) at once; all stop after the test."""
    monkeypatch.setattr(proxy_server, "START_TIMEOUT_S", PROCESS_START_TIMEOUT_S)
    started: list[ProxyProcess] = []

    def start(raw: dict[str, Any], *names: str) -> list[ProxyProcess]:
        processes = []
        for name in names:
            workdir = tmp_path / f"replica-{name}"
            workdir.mkdir()
            processes.append(ProxyProcess(raw, workdir, log_level="info"))
        started.extend(processes)
        with ThreadPoolExecutor(len(processes)) as pool:
            list(pool.map(ProxyProcess.start, processes))
        return processes

    yield start
    for process in reversed(started):
        process.stop()


def sdk(replica: ProxyProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{replica.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def async_sdk(replica: ProxyProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{replica.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def log_tail(replicas: Sequence[ProxyProcess], chars: int = 3000) -> str:
    return "\n".join(f"--- {r.log_path.parent.name}\n{r.log_path.read_text()[-chars:]}" for r in replicas)


def ask(
    client: openai.OpenAI, model: str, messages: Messages, headers: Mapping[str, str], *, stream: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """One request: the assistant message the client appends, and the response headers."""
    sent = cast("list[ChatCompletionMessageParam]", messages)
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=model, messages=sent, stream=True, extra_headers=dict(headers)
        ) as response:
            return assemble(list(response.parse())), dict(response.headers.items())
    raw = client.chat.completions.with_raw_response.create(model=model, messages=sent, extra_headers=dict(headers))
    return {"role": "assistant", "content": raw.parse().choices[0].message.content}, dict(raw.headers.items())


# --- reading the shared database --------------------------------------------------------------------------------


def session_ids(database: str) -> list[str]:
    return [row[0] for row in committed_rows(database, "SELECT id FROM sessions ORDER BY created_at")]


def messages_by_id(database: str) -> dict[str, tuple[str | None, str, dict[str, Any]]]:
    """Every stored node: id → (parent id, role, body)."""
    rows = committed_rows(database, "SELECT id, parent_id, role, body FROM messages")
    return {row[0]: (row[1], row[2], json.loads(row[3])) for row in rows}


def path_to(nodes: Mapping[str, tuple[str | None, str, dict[str, Any]]], head: str | None) -> list[str]:
    """Node ids from the root to `head`, following `parent_id`."""
    path: list[str] = []
    while head is not None:
        path.append(head)
        head = nodes[head][0]
    return path[::-1]


def session_path(database: str, session_id: str) -> list[tuple[str, str]]:
    """The session's conversation as stored: (role, text) of each node from the root to its head."""
    [(head,)] = committed_rows(database, "SELECT head_id FROM sessions WHERE id = ?", (session_id,))
    nodes = messages_by_id(database)
    return [(nodes[node][1], content_text(nodes[node][2].get("content"))) for node in path_to(nodes, head)]


def as_sent(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(str(message["role"]), content_text(message.get("content"))) for message in messages]


def duplicated_summaries(database: str) -> list[tuple[Any, ...]]:
    """Ranges that more than one summary in force covers with the same strategy."""
    return committed_rows(
        database,
        "SELECT start_depth, end_id, strategy, COUNT(*) FROM summaries WHERE orphaned_at IS NULL "
        "GROUP BY start_depth, end_id, strategy HAVING COUNT(*) > 1",
    )


def summary_rows(database: str) -> list[tuple[Any, ...]]:
    return committed_rows(
        database, "SELECT id, start_depth, end_depth, end_id, strategy, generated_by, orphaned_at FROM summaries"
    )


def summarizer_calls(fake: FakeUpstream) -> int:
    return sum(1 for request in fake.requests if is_summarizer_request(request.body))


def assert_no_duplicated_summarizer_work(database: str, fake: FakeUpstream, replicas: Sequence[ProxyProcess]) -> None:
    """Each summary was written once, and each summarizer call became exactly one summary."""
    summaries = summary_rows(database)
    assert duplicated_summaries(database) == [], summaries
    assert {row[5] for row in summaries} <= {"llm"}, summaries
    assert summarizer_calls(fake) == len(summaries), (summaries, log_tail(replicas))


# --- 1. one conversation, alternating replicas -----------------------------------------------------------------


def test_a_conversation_alternating_replicas_stays_one_session_with_exact_history_and_no_duplicate_summaries(
    tmp_path: Path, postgres: PostgresServer, fake: FakeUpstream, start_replicas: StartReplicas
) -> None:
    """Two conversations at once on the 4k model, long enough to compact several times, turn i on replica i % 2
    (the second one in the opposite phase): one found by its content (no X-Session-Id), one named by the header."""
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    database = postgres.database()
    replicas = start_replicas(replica_config(tmp_path, fake, database), "a", "b")
    clients = [sdk(replica) for replica in replicas]
    turns = 44
    # One system prompt: a system message is identified by its position, so both share their root node.
    conversations: dict[str, Messages] = {
        name: [{"role": "system", "content": "You answer questions about the project."}]
        for name in ("anchored", "named")
    }
    rng = seeded("replicas")
    anchored_ids: set[str] = set()
    compacting_turns = 0
    try:
        for turn in range(turns):
            for offset, (name, messages) in enumerate(conversations.items()):
                messages.append({"role": "user", "content": filler(rng, rng.randint(*USER_WORDS))})
                headers = {"X-Session-Id": "named-session"} if name == "named" else {}
                before = summarizer_calls(fake)
                answer, response_headers = ask(
                    clients[(turn + offset) % 2], "small", messages, headers, stream=turn % 5 == 4
                )
                messages.append(answer)
                compacting_turns += summarizer_calls(fake) > before
                if name == "anchored":
                    anchored_ids.add(response_headers["x-session-id"])
                else:
                    assert response_headers["x-session-id"] == "named-session"
    finally:
        for client in clients:
            client.close()

    assert fake.rejected == []
    assert len(anchored_ids) == 1, anchored_ids
    [anchored] = anchored_ids
    assert sorted(session_ids(database)) == sorted([anchored, "named-session"])
    assert session_path(database, anchored) == as_sent(conversations["anchored"])
    assert session_path(database, "named-session") == as_sent(conversations["named"])
    # Several compactions per conversation: the check below has something to count.
    assert compacting_turns >= 4, compacting_turns
    assert_no_duplicated_summarizer_work(database, fake, replicas)


# --- 2. one session, concurrent requests on both replicas ------------------------------------------------------


async def fire(replicas: Sequence[ProxyProcess], requests: Sequence[tuple[Messages, Mapping[str, str]]]) -> list[Any]:
    """Send the requests all at once, request i to replica i % 2; the answers (or exceptions), in order."""
    clients = [async_sdk(replica) for replica in replicas]
    try:

        async def one(index: int, messages: Messages, headers: Mapping[str, str]) -> Any:
            sent = cast("list[ChatCompletionMessageParam]", messages)
            return await clients[index % len(clients)].chat.completions.create(
                model="small", messages=sent, extra_headers=dict(headers)
            )

        return await asyncio.gather(
            *(one(index, messages, headers) for index, (messages, headers) in enumerate(requests)),
            return_exceptions=True,
        )
    finally:
        for client in clients:
            await client.close()


def step_rows(database: str, session_id: str) -> list[tuple[Any, ...]]:
    return committed_rows(
        database,
        "SELECT id, status, parent_message_id, message_id, content FROM journal_steps WHERE session_id = ? ORDER BY id",
        (session_id,),
    )


async def test_concurrent_requests_on_one_session_across_replicas_never_duplicate_a_message_or_a_summary(
    tmp_path: Path, postgres: PostgresServer, fake: FakeUpstream, start_replicas: StartReplicas
) -> None:
    """Six identical requests at once, then six that branch from one prefix with the history just past the
    budget (so every one of them needs the same compaction on its request path; pre-compaction is off)."""
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    database = postgres.database()
    replicas = start_replicas(replica_config(tmp_path, fake, database, precompact_ratio="off"), "a", "b")
    headers = {"X-Session-Id": "shared"}
    rng = seeded("concurrent")
    history: Messages = [{"role": "system", "content": "You answer questions about the shared project."}]
    clients = [sdk(replica) for replica in replicas]
    try:
        tokens = 0
        turn = 0
        while tokens < SMALL_BUDGET * 0.8:
            history.append({"role": "user", "content": filler(rng, rng.randint(*USER_WORDS))})
            answer, response_headers = ask(clients[turn % 2], "small", history, headers)
            history.append(answer)
            tokens = int(response_headers["x-context-tokens"])
            turn += 1
    finally:
        for client in clients:
            client.close()
    assert summarizer_calls(fake) == 0, "the prefix compacted already: the burst would not race for a summary"
    stored_before = len(messages_by_id(database))

    same = [*history, {"role": "user", "content": "The same question, asked six times at once."}]
    answers = await fire(replicas, [(same, headers)] * 6)
    assert not [a for a in answers if isinstance(a, BaseException)], (answers, log_tail(replicas))
    texts = {answer.choices[0].message.content for answer in answers}
    assert len(texts) == 1
    [text] = texts
    nodes = messages_by_id(database)
    assert len(nodes) == stored_before + 2  # one user node, one answer node
    steps = step_rows(database, "shared")[-6:]
    assert {step[1] for step in steps} == {"sealed"}, steps
    assert len({step[3] for step in steps}) == 1, steps
    assert session_path(database, "shared") == as_sent([*same, {"role": "assistant", "content": text}])

    # ~850 tokens each: every branch is over the budget, and the shared prefix is what must be summarized.
    branches = [
        [*history, {"role": "user", "content": f"Branch {n}. " + filler(seeded(f"branch {n}"), 700)}] for n in range(6)
    ]
    # A slow summarizer: both replicas are compacting at once unless one waits for the other.
    fake.delay = lambda body: SLOW_SUMMARIZER_S if is_summarizer_request(body) else 0.0
    answers = await fire(replicas, [(branch, headers) for branch in branches])
    assert not [a for a in answers if isinstance(a, BaseException)], (answers, log_tail(replicas))
    assert fake.rejected == []
    nodes = messages_by_id(database)
    assert len(nodes) == stored_before + 2 + 2 * len(branches)
    steps = step_rows(database, "shared")[-6:]
    assert {step[1] for step in steps} == {"sealed"}, steps
    for branch, answer in zip(branches, answers, strict=True):
        # Each branch is stored once, as sent, with its own answer at its end.
        [step] = [s for s in steps if s[4] == answer.choices[0].message.content]
        path = path_to(nodes, step[3])
        assert [(nodes[node][1], content_text(nodes[node][2].get("content"))) for node in path] == as_sent(
            [*branch, {"role": "assistant", "content": answer.choices[0].message.content}]
        )
    [(head,)] = committed_rows(database, "SELECT head_id FROM sessions WHERE id = 'shared'")
    assert head in {step[3] for step in steps}
    assert session_ids(database) == ["shared"]
    assert summarizer_calls(fake) > 0
    assert_no_duplicated_summarizer_work(database, fake, replicas)


# --- 3. fifty sessions over both replicas ------------------------------------------------------------------------


async def test_fifty_sessions_of_twenty_turns_over_both_replicas_have_no_error(
    tmp_path: Path, postgres: PostgresServer, fake: FakeUpstream, start_replicas: StartReplicas
) -> None:
    fake.context_window = BIG_WINDOW
    database = postgres.database()
    replicas = start_replicas(replica_config(tmp_path, fake, database), "a", "b")
    sessions, turns = 50, 20
    clients = [async_sdk(replica) for replica in replicas]
    errors: list[str] = []

    async def converse(n: int) -> Messages:
        messages: Messages = [{"role": "system", "content": "Be brief."}]
        for turn in range(turns):
            messages.append({"role": "user", "content": f"c{n} t{turn}"})
            sent = cast("list[ChatCompletionMessageParam]", messages)
            try:
                completion = await clients[(n + turn) % 2].chat.completions.create(
                    model="big", messages=sent, extra_headers={"X-Session-Id": f"conversation-{n}"}
                )
            except openai.APIError as exc:
                errors.append(f"conversation {n} turn {turn}: {exc!r}")
                return messages
            answer = completion.choices[0].message.content
            if answer != f"echo: c{n} t{turn}":
                errors.append(f"conversation {n} turn {turn}: {answer!r}")
            messages.append({"role": "assistant", "content": answer})
        return messages

    try:
        conversations = await asyncio.gather(*(converse(n) for n in range(sessions)))
    finally:
        for client in clients:
            await client.close()

    assert errors == [], (errors[:10], log_tail(replicas))
    assert len(fake.requests) == sessions * turns, "a request was retried or made twice"
    assert sorted(session_ids(database)) == sorted(f"conversation-{n}" for n in range(sessions))
    for n, messages in enumerate(conversations):
        assert len(messages) == 1 + 2 * turns
        assert session_path(database, f"conversation-{n}") == as_sent(messages)
    assert committed_rows(database, "SELECT status, COUNT(*) FROM journal_steps GROUP BY status") == [
        ("sealed", sessions * turns)
    ]


# --- 4. kill -9 one replica mid-stream ---------------------------------------------------------------------------

LONG_REPLY = " ".join(f"long{n}" for n in range(60))


def long_or_echo(body: dict[str, Any]) -> Reply:
    last = content_text(body["messages"][-1].get("content"))
    return Reply(content=LONG_REPLY) if "long" in last else Reply(content=f"echo: {last}")


def journaled_text(database: str, step_id: int) -> str:
    events = committed_rows(
        database, "SELECT content FROM journal_events WHERE step_id = ? AND type = 'text' ORDER BY seq", (step_id,)
    )
    return "".join(
        (choice.get("delta") or {}).get("content") or ""
        for (content,) in events
        for choice in json.loads(content).get("choices") or []
    )


def recoveries(replicas: Sequence[ProxyProcess]) -> list[tuple[str, dict[str, int], int]]:
    """Every journal recovery the replicas logged: (replica, counts, steps another process ended first)."""
    found = []
    for replica in replicas:
        for match in RECOVERY_LINE.finditer(replica.log_path.read_text()):
            counts = json.loads(match.group(1).replace("'", '"'))
            found.append((replica.log_path.parent.name, counts, int(match.group(2))))
    return found


def test_a_replica_killed_mid_stream_leaves_what_its_client_saw_and_a_survivor_recovers_it_once(
    tmp_path: Path, postgres: PostgresServer, fake: FakeUpstream, start_replicas: StartReplicas
) -> None:
    fake.responder = long_or_echo
    database = postgres.database()
    raw = replica_config(tmp_path, fake, database)
    doomed, survivor = start_replicas(raw, "a", "b")
    headers = {"X-Session-Id": "killed"}
    messages: Messages = [{"role": "system", "content": "Be verbose."}, {"role": "user", "content": "hello"}]
    with sdk(survivor) as client:
        answer, _ = ask(client, "big", messages, headers)
    messages.append(answer)
    messages.append({"role": "user", "content": "tell me something long"})

    fake.chunk_delay_s = 0.25
    seen = ""
    with sdk(doomed) as client:
        stream = client.chat.completions.create(
            model="big", messages=cast("list[ChatCompletionMessageParam]", messages), stream=True, extra_headers=headers
        )
        with stream, pytest.raises((openai.APIError, httpx.HTTPError)):
            content_chunks = 0
            for chunk in stream:
                text = "".join(choice.delta.content or "" for choice in chunk.choices)
                seen += text
                content_chunks += bool(text)
                if content_chunks == 5:
                    doomed.kill()
    fake.chunk_delay_s = 0.0
    assert seen
    assert LONG_REPLY.startswith(seen)

    [(step_id, status)] = committed_rows(
        database, "SELECT id, status FROM journal_steps WHERE session_id = 'killed' AND stream = 1"
    )
    assert status in ("open", "interrupted")
    stored = journaled_text(database, step_id)
    assert stored.startswith(seen), (stored, seen)
    assert LONG_REPLY.startswith(stored)

    # The client asks again, on the replica still up: the whole answer, and the session goes on from there.
    with sdk(survivor) as client:
        answer, _ = ask(client, "big", messages, headers, stream=True)
    assert answer["content"] == LONG_REPLY
    messages.append(answer)

    # A third replica starts (and recovers at startup) while the survivor sweeps: the dead step ends once.
    [newcomer] = start_replicas(raw, "c")
    fleet = [survivor, newcomer]

    def settled() -> str | None:
        [(status,)] = committed_rows(database, "SELECT status FROM journal_steps WHERE id = ?", (step_id,))
        return None if status == "open" else str(status)

    deadline = time.monotonic() + SETTLE_S
    while (status := settled()) is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert status == "interrupted", log_tail(fleet)
    # Whoever ended it, the survivor's next sweep (after its heartbeat) finds nothing left to end.
    [(first_started,)] = committed_rows(database, "SELECT MIN(started_at) FROM journal_owners")
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and not committed_rows(
        database, "SELECT id FROM journal_owners WHERE heartbeat_at > started_at AND started_at = ?", (first_started,)
    ):
        time.sleep(POLL_S)
    time.sleep(SWEEP_GRACE_S)
    assert committed_rows(database, "SELECT content FROM journal_steps WHERE id = ?", (step_id,)) == [(stored,)]
    ended = [entry for entry in recoveries(fleet) if sum(entry[1].values())]
    assert [entry[1] for entry in ended] == [{"complete": 0, "interrupted": 1, "failed": 0}], log_tail(fleet)
    assert committed_rows(database, "SELECT COUNT(*) FROM journal_owners") == [(2,)]

    # The partial answer never joined the history; the answer given on the survivor is there, once.
    assert session_path(database, "killed") == as_sent(messages)
    bodies = [body for _parent, _role, body in messages_by_id(database).values()]
    assert sum(content_text(body.get("content")) == LONG_REPLY for body in bodies) == 1
    assert not any(content_text(body.get("content")) == stored for body in bodies)
    with sdk(newcomer) as client:
        messages.append({"role": "user", "content": "and now?"})
        answer, _ = ask(client, "big", messages, headers)
    assert answer["content"] == "echo: and now?"


def test_a_correction_one_replica_learned_is_not_paid_again_by_the_other(
    tmp_path: Path, postgres: PostgresServer, fake: FakeUpstream, start_replicas: StartReplicas
) -> None:
    # The upstream counts 40 % more than the proxy: its first crossing is refused once, and healed, on replica a.
    fake.token_ratio = 1.4
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    replicas = start_replicas(replica_config(tmp_path, fake, postgres.database()), "a", "b")
    first, second = (sdk(replica) for replica in replicas)
    rng = seeded("corrections")
    try:
        messages: Messages = [{"role": "system", "content": "You answer briefly."}]
        for _ in range(30):
            messages.append({"role": "user", "content": filler(rng, 120)})
            messages.append(ask(first, "small", messages, {})[0])
            if fake.rejected:
                break
        assert len(fake.rejected) == 1
        time.sleep(REFRESH_S + 1)  # replica b reads what a learned
        other: Messages = [{"role": "system", "content": "Another conversation."}]
        for _ in range(30):
            other.append({"role": "user", "content": filler(rng, 120)})
            other.append(ask(second, "small", other, {})[0])
    finally:
        first.close()
        second.close()
    assert len(fake.rejected) == 1, log_tail(replicas)
    assert any(is_summarizer_request(request.body) for request in fake.requests)  # b compacted too
