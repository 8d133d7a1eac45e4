"""The conversation store on a real SQLite file: prefixes, branches, cached counts, tenants, concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy import tokens
from proxy.canonical.sharing import LINEAGE_DEPTH, known_shared, shared_prefix
from proxy.canonical.vocabulary import ITEMS
from proxy.errors import InvalidRequest
from proxy.history import chain
from proxy.history.caches import RecentPaths
from proxy.history.messages import StoredMessage, StoredPath
from proxy.history.path_match import CachedMessage
from proxy.history.store import History
from proxy.store.database import Database

ENCODING = "cl100k_base"
MODEL = "gpt-4"


class Counter:
    """tiktoken, with a tally of the messages it was asked to count."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, message: Mapping[str, Any], encoding: str) -> int:
        self.calls += 1
        return tokens.count_message(message, encoding)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def history(db: Database, counter: Counter) -> History:
    return History(db, clock=Clock(), count=counter)


def conversation(turns: int, tag: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"be brief {tag}"}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} {tag}"})
        messages.append({"role": "assistant", "content": f"answer {turn} {tag}"})
    return messages


async def count(db: Database, table: str) -> int:
    row = await db.fetchone(f"SELECT COUNT(*) FROM {table}")
    assert row is not None
    return int(row[0])


async def test_extending_a_stored_path_writes_only_the_new_messages(db: Database, history: History) -> None:
    first = await history.reconcile("t", "s", conversation(1), MODEL, ENCODING)
    assert first.stored_before == 0
    assert [m.depth for m in first.path] == [0, 1, 2]
    assert first.session.head_id == first.path[-1].id
    assert await count(db, "messages") == 3

    second = await history.reconcile("t", "s", conversation(2), MODEL, ENCODING)
    assert second.stored_before == 3
    assert [m.id for m in second.path[:3]] == [m.id for m in first.path]
    assert second.path[3].parent_id == first.path[-1].id
    assert await count(db, "messages") == 5
    assert await count(db, "message_tokens") == 5
    assert second.session.head_id == second.path[-1].id


async def test_every_node_records_its_token_count(history: History) -> None:
    result = await history.reconcile("t", "s", conversation(1), MODEL, ENCODING)
    assert [m.tokens for m in result.path] == [tokens.count_message(m.message, ENCODING) for m in result.path]


async def test_an_edit_starts_a_branch_and_keeps_the_old_one(db: Database, history: History) -> None:
    original = await history.reconcile("t", "s", conversation(2), MODEL, ENCODING)
    edited = conversation(2)
    edited[3] = {"role": "user", "content": "question 1, rephrased"}
    branch = await history.reconcile("t", "s", edited[:4], MODEL, ENCODING)

    assert branch.stored_before == 3
    assert branch.path[3].parent_id == original.path[2].id
    assert branch.path[3].id != original.path[3].id
    assert await count(db, "messages") == 6
    old = await history.path_to(original.path[-1].id)
    assert [m.message for m in old] == conversation(2)
    new = await history.path("t", "s")
    assert new is not None
    assert [m.message for m in new] == edited[:4]


async def test_a_re_sent_history_counts_no_tokens(db: Database, history: History, counter: Counter) -> None:
    messages = conversation(3)
    first = await history.reconcile("t", "s", messages, MODEL, ENCODING)
    assert counter.calls == len(messages)

    again = await history.reconcile("t", "s", [dict(m) for m in messages], MODEL, ENCODING)
    restarted = await History(db, count=counter).reconcile("t", "s", messages, MODEL, ENCODING)
    assert counter.calls == len(messages)
    for result in (again, restarted):
        assert result.stored_before == len(messages)
        assert [m.tokens for m in result.path] == [m.tokens for m in first.path]
        assert [m.created_at for m in result.path] == [m.created_at for m in first.path]


async def test_another_encoding_is_counted_once_lazily(db: Database, history: History, counter: Counter) -> None:
    await history.reconcile("t", "s", conversation(1), MODEL, ENCODING)
    counter.calls = 0
    path = await history.path("t", "s", "o200k_base")
    assert path is not None
    assert counter.calls == 3
    assert await count(db, "message_tokens") == 6
    await history.path("t", "s", "o200k_base")
    await History(db, count=counter).reconcile("t", "s", conversation(1), "gpt-4o", "o200k_base")
    assert counter.calls == 3


async def test_everything_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    db = await Database.open(path)
    before = await History(db).reconcile("t", "s", conversation(2), MODEL, ENCODING)
    await db.close()

    db = await Database.open(path)
    try:
        counter = Counter()
        history = History(db, count=counter)
        session = await history.session("t", "s")
        assert session == before.session
        stored = await history.path("t", "s")
        assert stored == list(before.path)
        again = await history.reconcile("t", "s", conversation(2), MODEL, ENCODING)
        assert again.stored_before == 5
        assert counter.calls == 0
    finally:
        await db.close()


async def test_a_session_is_derived_from_the_opening_without_a_header(history: History) -> None:
    first = await history.reconcile("t", None, conversation(1), MODEL, ENCODING)
    second = await history.reconcile("t", None, conversation(2), MODEL, ENCODING)
    assert first.session.id.startswith("s-")
    assert second.session.id == first.session.id
    assert second.stored_before == 3


async def test_empty_messages_are_rejected(history: History) -> None:
    with pytest.raises(InvalidRequest):
        await history.reconcile("t", "s", [], MODEL, ENCODING)


async def test_a_caller_mutating_a_returned_message_does_not_change_the_next_request(
    history: History,
) -> None:
    first = await history.reconcile("t", "s", conversation(1), MODEL, ENCODING)
    first.path[1].message["content"] = "tampered"
    again = await history.reconcile("t", "s", conversation(1), MODEL, ENCODING)
    assert again.path[1].message == conversation(1)[1]
    assert again.stored_before == 3
    tampered = conversation(1)
    tampered[1]["content"] = "tampered"
    assert (await history.reconcile("t", "s", tampered, MODEL, ENCODING)).stored_before == 1


async def test_tenants_never_see_or_extend_each_others_sessions(db: Database, history: History) -> None:
    ours = await history.reconcile("a", "shared", conversation(1), MODEL, ENCODING)
    assert await history.session("b", "shared") is None
    assert await history.path("b", "shared") is None
    assert await history.sessions("b") == ([], False)

    theirs = await history.reconcile("b", "shared", conversation(2), MODEL, ENCODING)
    assert theirs.stored_before == 0
    assert theirs.session.tenant == "b"
    assert not {m.id for m in theirs.path} & {m.id for m in ours.path}
    still_ours = await history.session("a", "shared")
    assert still_ours is not None
    assert still_ours.head_id == ours.path[-1].id
    assert await count(db, "messages") == 3 + 5


async def test_sessions_are_listed_newest_first_with_their_size(db: Database, history: History) -> None:
    first = await history.reconcile("t", "one", conversation(1), MODEL, ENCODING)
    await history.reconcile("t", "two", conversation(2, "b"), "gpt-4o", "o200k_base")
    await history.reconcile("other", "three", conversation(1), MODEL, ENCODING)

    async def summarize(end_id: str, orphaned_at: float | None) -> None:
        def write(connection: Any) -> None:
            connection.execute(
                "INSERT INTO summaries (tenant, start_depth, end_depth, end_id, content, tokens,"
                " original_tokens, model, generated_by, orphaned_at, created_at)"
                " VALUES ('t', 0, 1, ?, 's', 1, 2, 'm', 'llm', ?, 0)",
                (end_id, orphaned_at),
            )

        await db.write(write)

    await summarize(first.path[1].id, None)
    await summarize(first.path[1].id, 5.0)

    page, more = await history.sessions("t", limit=1)
    assert more
    assert [info.id for info in page] == ["two"]
    assert page[0].message_count == 5
    assert page[0].model == "gpt-4o"
    two = await history.path("t", "two")  # the default encoding, counted lazily for the listing
    assert two is not None
    assert page[0].history_tokens == sum(m.tokens for m in two)

    page, more = await history.sessions("t", limit=1, offset=1)
    assert not more
    assert page[0].id == "one"
    assert page[0].message_count == 3
    assert page[0].history_tokens == sum(m.tokens for m in first.path)
    assert page[0].summaries == 1


async def test_settings_hold_from_where_they_were_sent_on(history: History) -> None:
    first = await history.reconcile("t", "s", conversation(1), MODEL, ENCODING)
    assert first.settings == {}
    set_at_one = await history.attach_settings(first, {"budget": 1000, "preserve_recent": 6})
    assert set_at_one.settings == {"budget": 1000, "preserve_recent": 6}
    two = await history.reconcile("t", "s", conversation(2), MODEL, ENCODING)
    assert two.settings == {"budget": 1000, "preserve_recent": 6}
    changed = await history.attach_settings(two, {"budget": None, "mode": "auto"})
    assert changed.settings == {"preserve_recent": 6, "mode": "auto"}
    three = await history.reconcile("t", "s", conversation(3), MODEL, ENCODING)
    assert three.settings == {"preserve_recent": 6, "mode": "auto"}

    # A branch from before the change keeps what held there; another conversation has none of it.
    branch = [*conversation(1), {"role": "user", "content": "edited"}]
    assert (await history.reconcile("t", "s", branch, MODEL, ENCODING)).settings == {
        "budget": 1000,
        "preserve_recent": 6,
    }
    assert (await history.reconcile("t", "s", conversation(1, "other"), MODEL, ENCODING)).settings == {}
    assert (await history.reconcile("u", "s", conversation(3), MODEL, ENCODING)).settings == {}
    path = await history.path("t", "s")
    assert path is not None
    assert await history.settings_on("t", path) == {}


async def test_settings_are_found_without_the_process_cache(db: Database, history: History) -> None:
    first = await history.reconcile("t", "s", conversation(2), MODEL, ENCODING)
    await history.attach_settings(first, {"budget": 900})
    cold = History(db, clock=Clock())
    again = await cold.reconcile("t", None, conversation(3), MODEL, ENCODING)
    assert again.settings == {"budget": 900}


def drifting(turns: int, tag: str = "") -> list[dict[str, Any]]:
    messages = conversation(turns, tag)
    messages[0] = {"role": "system", "content": f"The time is 10:{turns:02d}. {tag}"}
    return messages


async def test_a_rewritten_system_prompt_is_a_variant_of_the_same_node(db: Database, history: History) -> None:
    first = await history.reconcile("t", "s", drifting(1), MODEL, ENCODING)
    second = await history.reconcile("t", "s", drifting(2), MODEL, ENCODING)
    assert second.stored_before == 3
    assert [m.id for m in second.path[:3]] == [m.id for m in first.path]
    assert second.path[0].message == drifting(2)[0]  # the request's own prompt, with its own count
    assert second.path[0].tokens == tokens.count_message(drifting(2)[0], ENCODING)
    assert await count(db, "messages") == 5
    rows = await db.fetchall("SELECT body FROM message_variants")
    assert [row[0] for row in rows] == ['{"content":"The time is 10:02. ","role":"system"}']

    cold = History(db, clock=Clock())  # without the process cache: found by id, the variant known
    third = await cold.reconcile("t", "s", drifting(2), MODEL, ENCODING)
    assert third.stored_before == 5
    assert third.path[0].message == drifting(2)[0]
    assert await count(db, "message_variants") == 1


async def test_a_path_s_totals_are_those_of_its_messages_however_the_requests_change(history: History) -> None:
    """A request's path carries its totals from the session's path before (`PathTotals`): they are what walking
    the path gives, as the conversation grows, has its system prompt rewritten, gets a developer message,
    branches and is cut back."""
    from proxy.history.messages import StoredPath

    grown = [*drifting(1), {"role": "user", "content": "more"}, {"role": "assistant", "content": "yes"}]
    requests = [
        drifting(1),
        grown,
        [*grown, {"role": "developer", "content": "be terse"}, {"role": "user", "content": "go"}],
        [drifting(2)[0], *grown[1:]],  # the system prompt rewritten: a variant at the first message
        [*grown[:3], {"role": "user", "content": "another branch"}],
        grown[:2],
    ]
    for messages in requests:
        path = (await history.reconcile("t", "s", messages, MODEL, ENCODING)).path
        fresh = StoredPath(list(path))
        assert path.tokens == fresh.tokens
        assert path.system == fresh.system


async def test_a_turn_re_sent_with_only_its_blocks_changed_keeps_its_count(
    db: Database, history: History, counter: Counter
) -> None:
    """Claude Code moves its cache breakpoint every turn: the last turn comes back with other blocks, the same
    chat meaning; it is a variant, and its count (which the blocks do not change) is not taken again."""
    blocks = [{"type": "text", "text": "run it", "cache_control": {"type": "ephemeral"}}]
    sent = [*conversation(1), {"role": "user", "content": "run it", ITEMS: blocks}]
    await history.reconcile("t", "s", sent, MODEL, ENCODING)
    moved = [*sent[:-1], {"role": "user", "content": "run it", ITEMS: [{"type": "text", "text": "run it"}]}]
    before = counter.calls
    again = await history.reconcile("t", "s", [*moved, {"role": "assistant", "content": "done"}], MODEL, ENCODING)
    assert counter.calls == before + 1  # the new answer only
    assert again.path[3].message == moved[3]
    assert again.path[3].tokens == tokens.count_message(moved[3], ENCODING)
    assert await count(db, "message_variants") == 1


async def test_history_re_sent_with_other_whitespace_lands_on_the_same_nodes(db: Database, history: History) -> None:
    first = await history.reconcile("t", "s", conversation(3), MODEL, ENCODING)
    restored = [{**m, "content": "\n" + m["content"] + "  "} if m["role"] != "system" else m for m in conversation(3)]
    for cache in (history, History(db, clock=Clock())):
        again = await cache.reconcile("t", "s", [*restored, {"role": "user", "content": "new"}], MODEL, ENCODING)
        assert [m.id for m in again.path[:7]] == [m.id for m in first.path]
        assert again.path[1].message == restored[1]
    assert await count(db, "messages") == 8
    assert await count(db, "message_variants") == 6


async def test_a_regenerated_request_finds_its_derived_session_without_asking_the_store(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that repeats part of a cached path holding the session's anchor, and adds only new nodes (the
    same question asked again: a regenerated answer), is that session's; one that holds no anchor is looked up."""
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "task"}]
    opened = await history.reconcile("t", None, first, MODEL, ENCODING)
    longer = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert (await history.reconcile("t", None, longer, MODEL, ENCODING)).session.id == opened.session.id

    async def refused(*_: Any) -> None:
        raise AssertionError("the store was asked")

    with monkeypatch.context() as patched:
        patched.setattr(history, "_derived", refused)
        again = await history.reconcile("t", None, first, MODEL, ENCODING)
        edited = await history.reconcile(
            "t", None, [*first[:2], {"role": "assistant", "content": "?"}], MODEL, ENCODING
        )
    assert again.session.id == edited.session.id == opened.session.id
    with pytest.raises(AssertionError, match="the store was asked"), monkeypatch.context() as patched:
        patched.setattr(history, "_derived", refused)
        await history.reconcile("t", None, first[:1], MODEL, ENCODING)  # short of the anchor


async def test_a_derived_session_is_found_by_its_first_request(history: History) -> None:
    opening = [
        {"role": "system", "content": "You are a coding assistant."},
        {"role": "user", "content": "Example request"},
        {"role": "assistant", "content": "Example answer"},
    ]
    a = await history.reconcile("t", None, [*opening, {"role": "user", "content": "task A"}], MODEL, ENCODING)
    b = await history.reconcile("t", None, [*opening, {"role": "user", "content": "task B"}], MODEL, ENCODING)
    assert a.session.id != b.session.id
    assert a.session.anchor_id == a.path[-1].id

    cold = History(history._db, clock=Clock())  # found by anchor, not by the process cache
    for store in (history, cold):
        later_a = [*opening, {"role": "user", "content": "task A"}, {"role": "assistant", "content": "ok"}]
        later_a[0] = {"role": "system", "content": "You are a coding assistant. It is 11:00."}
        assert (
            await store.reconcile("t", None, [*later_a, {"role": "user", "content": "next"}], MODEL, ENCODING)
        ).session.id == a.session.id
        later_b = [*opening, {"role": "user", "content": "task B"}, {"role": "assistant", "content": "ok"}]
        assert (await store.reconcile("t", None, later_b, MODEL, ENCODING)).session.id == b.session.id
    # A trailing system reminder is not where the conversation ends.
    reminded = [*opening, {"role": "user", "content": "task C"}, {"role": "system", "content": "Reply in diffs."}]
    c = await history.reconcile("t", None, reminded, MODEL, ENCODING)
    assert c.session.anchor_id == c.path[-2].id
    assert c.end_id == c.path[-2].id
    follow = [*reminded[:-1], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}, reminded[-1]]
    assert (await cold.reconcile("t", None, follow, MODEL, ENCODING)).session.id == c.session.id
    assert (await history.reconcile("u", None, reminded, MODEL, ENCODING)).session.id != c.session.id


async def test_identical_concurrent_requests_store_each_node_once(db: Database, history: History) -> None:
    await asyncio.gather(*(history.reconcile("t", "s", conversation(3), MODEL, ENCODING) for _ in range(10)))
    assert await count(db, "messages") == 7
    assert await count(db, "message_tokens") == 7


async def held_together(first: History, second: History, sessions: tuple[tuple[str, str], tuple[str, str]]) -> bool:
    """Whether `second` gets its session's lock while `first` holds its own."""
    async with first.lock(*sessions[0]):
        try:
            async with asyncio.timeout(0.5), second.lock(*sessions[1]):
                return True
        except TimeoutError:
            return False


async def test_the_lock_is_one_per_session_and_tenant(history: History) -> None:
    assert not await held_together(history, history, (("t", "s"), ("t", "s")))
    assert await held_together(history, history, (("t", "s"), ("u", "s")))
    assert await held_together(history, history, (("t", "s"), ("t", "s2")))


async def test_the_lock_holds_across_processes_sharing_the_store(db: Database, store_target: Path | str) -> None:
    """Another `Database` on the same store stands for another replica: its own connections, its own memory."""
    other = await Database.open(store_target)
    try:
        replica = History(other)
        mine = History(db)
        if db.dialect == "postgresql":
            assert not await held_together(mine, replica, (("t", "s"), ("t", "s")))
        assert await held_together(mine, replica, (("t", "s"), ("t", "s2")))
        assert await held_together(mine, replica, (("t", "s"), ("u", "s")))
        # Released on leaving, as the first check's own exit shows: it can be taken at once.
        async with asyncio.timeout(5), replica.lock("t", "s"):
            pass
    finally:
        await other.close()


async def test_a_request_without_a_session_id_never_joins_a_named_session(db: Database, history: History) -> None:
    named = await history.reconcile("t", "named", conversation(2), MODEL, ENCODING)
    for store in (history, History(db, clock=Clock())):  # with the process cache warm, and without it
        later = await store.reconcile("t", None, [*conversation(2), {"role": "user", "content": "on"}], MODEL, ENCODING)
        assert later.session.id != named.session.id
        assert later.session.anchor_id is not None


async def test_the_recent_path_cache_is_bounded_by_bytes_not_messages(history: History) -> None:
    """100 KB messages once grew the process by 592 MiB through this cache: its bound is what it weighs. (Here a
    tenth of both: four sessions of two 10 KB messages fit, as four of 100 KB fit in 1 MB.)"""
    history.recent = RecentPaths(max_bytes=100_000)
    big = "x" * 10_000
    for index in range(20):
        messages = [{"role": "user", "content": f"{index} {big}"}, {"role": "assistant", "content": big}]
        await history.reconcile("t", f"s{index}", messages, MODEL, ENCODING)
        assert history.recent.bytes <= 100_000
    assert history.recent.bytes > 80_000  # it does hold what fits
    newest = [{"role": "user", "content": f"19 {big}"}, {"role": "assistant", "content": big}]
    oldest = [{"role": "user", "content": f"0 {big}"}, {"role": "assistant", "content": big}]
    assert len(history.recent.match("t", ENCODING, "s19", newest).entries) == 2
    assert history.recent.match("t", ENCODING, "s0", oldest).entries == []


class Compared(dict[str, Any]):
    """A message that counts how often it is compared with another."""

    comparisons = 0

    def __ne__(self, other: object) -> bool:
        Compared.comparisons += 1
        return dict.__ne__(self, other)

    def __eq__(self, other: object) -> bool:
        Compared.comparisons += 1
        return dict.__eq__(self, other)

    __hash__ = None


async def test_messages_re_sent_as_the_same_objects_match_without_a_comparison(history: History) -> None:
    messages: list[dict[str, Any]] = [Compared(message) for message in conversation(3)]
    await history.reconcile("t", "s", messages, MODEL, ENCODING)
    Compared.comparisons = 0
    longer = [*messages, {"role": "user", "content": "question 3"}]
    again = await history.reconcile("t", "s", longer, MODEL, ENCODING)
    assert Compared.comparisons == 0
    assert again.stored_before == len(messages)
    assert [stored.message for stored in again.path] == longer

    # Equal objects that are not the same ones are compared, and match as before.
    copies: list[dict[str, Any]] = [Compared(message) for message in longer]
    third = await history.reconcile("t", "s", copies, MODEL, ENCODING)
    assert Compared.comparisons > 0
    assert third.stored_before == len(longer)


async def test_a_changed_message_after_shared_objects_is_a_branch(history: History) -> None:
    messages = conversation(4)
    first = await history.reconcile("t", "s", messages, MODEL, ENCODING)
    edited = [*messages[:5], {"role": "assistant", "content": "another answer"}, *messages[6:]]
    branch = await history.reconcile("t", "s", edited, MODEL, ENCODING)
    assert branch.stored_before == 5
    assert [stored.id for stored in branch.path[:5]] == [stored.id for stored in first.path[:5]]
    assert branch.path[5].id != first.path[5].id
    assert [stored.message for stored in branch.path] == edited


def cached_entry(depth: int, text: str) -> CachedMessage:
    role = "system" if depth % 3 == 0 else "user"
    message = {"role": role, "content": text}
    tokens = depth * 7 + ord(text)
    return CachedMessage(
        StoredMessage(f"{text}@{depth}", None, depth, role, message, tokens, 0.0), message, {}, depth + ord(text)
    )


def assert_walked(stored: StoredPath, entries: list[CachedMessage]) -> None:
    """`stored` is the path of `entries` with the totals a walk over all of them gives."""
    walked = StoredPath(entry.stored for entry in entries)
    assert stored == walked
    assert (stored.tokens, stored.system) == (walked.tokens, walked.system)


def test_a_path_cached_after_a_match_carries_what_the_match_found_it_shares() -> None:
    """What `match` found the request to start with is the cached path's own entries up to `reused`: the path
    cached after it is the request's, whether it grows, branches, or differs where the match stopped."""
    recent = RecentPaths()
    key = ("t", "s", ENCODING)
    first = [cached_entry(depth, "a") for depth in range(6)]
    recent.put(key, first, derived=False, sent=([entry.private for entry in first], len(first)))
    rewritten = {"role": "system", "content": "rewritten"}  # the same node, sent in another form
    variant = CachedMessage(replace(first[3].stored, message=rewritten), rewritten, {}, 1)
    requests = [
        [*first, cached_entry(6, "a")],  # grows
        [*first[:4], cached_entry(4, "b")],  # branches
        [*first[:2], cached_entry(2, "c"), *first[3:]],  # differs in the middle
        [*first[:3], variant, *first[4:]],  # a variant in the middle, the same objects after it
    ]
    for request in requests:
        messages = [entry.private for entry in request]
        found = recent.match("t", ENCODING, "s", messages)
        # As `History.locate` makes them: a variant's entry is the form sent.
        entries = [request[i] if i in found.variants else entry for i, entry in enumerate(found.entries)]
        entries += request[len(entries) :]
        assert_walked(recent.put(key, entries, derived=False, sent=(messages, len(messages)), matched=found), request)
        recent.put(key, first, derived=False, sent=([entry.private for entry in first], len(first)))


def identical_prefix(new: StoredPath, old: StoredPath) -> int:
    return next((i for i, (a, b) in enumerate(zip(new, old, strict=False)) if a is not b), min(len(new), len(old)))


def test_a_cached_path_knows_how_much_of_the_paths_before_it_it_holds() -> None:
    """Requests that grow, re-send a message in another form, branch or go back, each answered: the path cached
    for each knows (`shared_prefix`, no pass) how many of its first messages are the very ones of each recent
    path before it, through the answers' paths between them: what comparing them object by object gives."""
    recent = RecentPaths()
    key = ("t", "s", ENCODING)
    first = [cached_entry(depth, "a") for depth in range(6)]
    answers = [cached_entry(6, "p"), cached_entry(8, "q")]
    rewritten = {"role": "user", "content": "rewritten"}
    variant = CachedMessage(replace(first[4].stored, message=rewritten), rewritten, {}, 1)
    grown = [*first, answers[0], cached_entry(7, "a")]
    steps = [
        (first, answers[0]),
        (grown, answers[1]),  # grows after the answer
        ([*first[:4], variant, first[5], answers[0], grown[7], answers[1], cached_entry(9, "a")], None),
        ([*first[:3], cached_entry(3, "b")], None),  # branches
        ([*grown, answers[1], cached_entry(9, "a"), cached_entry(10, "a")], None),  # back on the first branch
    ]
    paths: list[StoredPath] = []
    for request, answer in steps:
        messages = [entry.private for entry in request]
        found = recent.match("t", ENCODING, "s", messages)
        entries = [request[i] if i in found.variants else entry for i, entry in enumerate(found.entries)]
        entries += request[len(entries) :]
        paths.append(recent.put(key, entries, derived=False, sent=(messages, len(messages)), matched=found))
        if answer is not None:
            recent.extend(key, request[-1].stored.id, answer.stored)
        for older in paths[-1 - LINEAGE_DEPTH // 2 : -1]:
            assert known_shared(paths[-1], older) is not None
            assert shared_prefix(paths[-1], older) == identical_prefix(paths[-1], older)
    assert [identical_prefix(paths[i + 1], paths[i]) for i in range(4)] == [6, 4, 3, 3]


def test_a_cached_path_weighs_its_entries_and_keeps_its_anchors_place_as_it_changes() -> None:
    """The weights and totals (tokens, system messages) over the shared part of the path before are carried: they
    are what walking the whole path again gives, whether the path grows, is cut back, branches or holds other
    objects."""

    recent = RecentPaths()
    key = ("t", "s", ENCODING)
    path = [cached_entry(depth, "a") for depth in range(6)]
    anchor = path[2].stored.id
    steps = [
        path,
        [*path, cached_entry(6, "a"), cached_entry(7, "a")],  # grows
        path[:4],  # cut back
        [*path[:3], cached_entry(3, "b"), cached_entry(4, "b")],  # branches after the anchor
        [cached_entry(depth, "a") for depth in range(5)],  # equal entries, other objects
        [cached_entry(0, "c"), cached_entry(1, "c")],  # the anchor is not on it
    ]
    for entries in steps:
        sent = [item.private for item in entries[:3]]
        stored = recent.put(key, entries, derived=True, anchor=anchor, sent=(sent, len(sent)))
        assert recent.bytes == sum(item.weight for item in entries) + sum(item.weight for item in entries[:3])
        # The path and totals carried are those of the whole path
        assert_walked(stored, entries)
        on_path = any(item.stored.id == anchor for item in entries)
        matched = recent.match("t", ENCODING, None, [item.private for item in entries])
        assert matched.anchored == on_path


def tool_session(output: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "run_shell_command", "arguments": "{}"}}
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Run the build."},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
        {"role": "assistant", "content": "It built."},
        {"role": "user", "content": "And now?"},
    ]


MASKED = (
    '{"output": "<tool_output_masked>\\nline 1\\n\\nOutput too large. Full output available at: '
    '/tmp/tool-outputs/run_shell_command_call_1.txt\\n</tool_output_masked>"}'
)


async def test_a_client_s_masked_tool_output_is_a_variant_of_the_same_node(db: Database, history: History) -> None:
    """Gemini CLI masks old tool outputs in its own history (`chain.CLIENT_MASKS`): the conversation stays one
    path, the original stays the node's body and the masked form is what this request sent."""
    original = tool_session('{"output": "' + "line of build output\\n" * 200 + '"}')
    first = await history.reconcile("t", None, original, MODEL, ENCODING)
    masked = tool_session(MASKED)
    masked += [{"role": "assistant", "content": "Nothing more."}, {"role": "user", "content": "Thanks."}]
    second = await history.reconcile("t", None, masked, MODEL, ENCODING)

    assert second.session.id == first.session.id
    assert [m.id for m in second.path[:6]] == [m.id for m in first.path]
    assert second.stored_before == 6
    assert second.path[3].message["content"] == MASKED
    assert await count(db, "message_variants") == 1
    rows = await db.fetchall("SELECT body FROM messages WHERE role = 'tool'")
    assert "line of build output" in rows[0][0]


async def test_a_changed_tool_output_that_is_no_mask_is_another_branch(history: History) -> None:
    first = await history.reconcile("t", None, tool_session('{"output": "ok"}'), MODEL, ENCODING)
    second = await history.reconcile("t", None, tool_session('{"output": "failed"}'), MODEL, ENCODING)
    assert second.stored_before == 3
    assert second.path[3].id != first.path[3].id


async def test_a_stored_path_reads_back_in_the_form_the_tenant_last_sent_it(history: History) -> None:
    """A client's summary brings its conversation back from the store (`continuations`): it must read as the client
    sent it (a null content, its own spacing of the arguments), which went upstream as it was."""
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    answered = [{"role": "user", "content": "run ls"}, {"role": "assistant", "tool_calls": [call]}]
    first = await history.reconcile("t", None, answered, "m", "cl100k_base")
    own = {**call, "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
    sent: list[dict[str, Any]] = [
        answered[0],
        {"role": "assistant", "content": None, "tool_calls": [own]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    later = await history.reconcile("t", first.session.id, sent, "m", "cl100k_base")
    path = await history.path_to(later.path[-1].id)
    assert path[1].message != sent[1]  # stored as the model answered it
    assert history.recent.sent_forms("t", path) == sent
    assert history.recent.sent_forms("other", path) is None


async def test_after_a_restart_a_stored_path_reads_back_in_the_latest_form_stored(db: Database) -> None:
    """A process that served none of the session's requests (a restart) has no request's own messages: the
    conversation reads back in the latest form stored of each node, the client's own encoding of the model's turn
    with the null it sent beside its tool calls (which went upstream as it was), not the form first stored."""
    before = History(db, clock=Clock())
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    answered = [{"role": "user", "content": "run ls"}, {"role": "assistant", "tool_calls": [call]}]
    first = await before.reconcile("t", None, answered, "m", "cl100k_base")
    own = {**call, "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
    sent: list[dict[str, Any]] = [
        answered[0],
        {"role": "assistant", "content": None, "tool_calls": [own]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    later = await before.reconcile("t", first.session.id, sent, "m", "cl100k_base")
    restarted = History(db, clock=Clock())
    path = await restarted.path_to(later.path[-1].id)
    assert restarted.recent.sent_forms("t", path) is None
    assert await restarted.sent_forms("t", path) == sent
    assert path[1].message != chain.normalize(sent[1])  # stored as the model answered it

    later = Clock()
    later.now = 5_000.0
    cold = History(db, clock=later)  # another form, found by its id (no cached path holds it)
    spaced = {**own, "function": {"name": "bash", "arguments": '{"command" :  "ls"}'}}
    again = [sent[0], {"role": "assistant", "content": None, "tool_calls": [spaced]}]
    assert (await cold.reconcile("t", "other", again, "m", "cl100k_base")).path[1].id == path[1].id
    assert (await History(db, clock=Clock()).sent_forms("t", path[:2]))[1] == again[1]


def opened_session(*turns: str) -> list[dict[str, Any]]:
    """A tool-using session as Gemini CLI sends it: its system prompt, its `<session_context>` (a system message,
    `doors.gemini.input`), then a user turn, a call, its output and an answer per turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "system", "content": "<session_context>today</session_context>"},
    ]
    for number, turn in enumerate(turns):
        call = {"id": f"call_{number}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
        messages += [
            {"role": "user", "content": turn},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{number}", "content": f"output {number}"},
            {"role": "assistant", "content": f"done {number}"},
        ]
    return messages


async def test_a_request_leaving_out_its_opening_user_turn_continues_the_session_with_it(
    db: Database, history: History
) -> None:
    """Gemini CLI 0.61.0 loses its first user turn from the history it resumes once it masked old outputs (its
    record of the turn is merged into the `<session_context>` it then skips): the request re-sends the rest of the
    session's path whole, so it is that session's next turn, and the turn it left out stays in place."""
    first = await history.reconcile("t", None, opened_session("Turn 1. Note: CODE=42", "Turn 2"), MODEL, ENCODING)
    resent = opened_session("Turn 1. Note: CODE=42", "Turn 2", "Turn 3")
    del resent[2]
    located = await history.locate("t", None, resent, ENCODING)
    second = await history.save(located, MODEL)

    assert second.session.id == first.session.id
    assert [m.id for m in second.path[: len(first.path)]] == [m.id for m in first.path]
    assert second.stored_before == len(first.path)
    assert second.path[2].message["content"] == "Turn 1. Note: CODE=42"
    assert [m["content"] for m in located.messages if m["role"] == "user"] == [
        "Turn 1. Note: CODE=42",
        "Turn 2",
        "Turn 3",
    ]
    assert len(located.messages) == len(resent) + 1
    assert await count(db, "messages") == len(first.path) + 4
    assert await count(db, "sessions") == 1

    # The next request leaves it out again: the same session, nothing written twice
    again = opened_session("Turn 1. Note: CODE=42", "Turn 2", "Turn 3", "Turn 4")
    del again[2]
    third = await history.reconcile("t", None, again, MODEL, ENCODING)
    assert third.session.id == first.session.id
    assert third.stored_before == len(second.path)
    assert await count(db, "sessions") == 1


async def test_after_a_restart_a_masked_output_and_a_left_out_opening_turn_still_continue_the_session(
    db: Database,
) -> None:
    """The recent paths are lost with the process, and only they recognize a form the client re-sends differently
    from the one stored: the first request after a restart, masking an old output and leaving out its opening
    turn (Gemini CLI 0.61.0 resumed), lands on the same nodes and session, as it would have before; with a session
    named (`X-Session-Id`) as without."""
    for session_id in (None, "named"):
        before = History(db, clock=Clock())
        turns = [f"Turn 1 {session_id}. Note: CODE=42", "Turn 2", "Turn 3"]
        opened = opened_session(*turns)
        opened[4] = {**opened[4], "content": "line of build output\n" * 200}
        first = await before.reconcile("t", session_id, opened, MODEL, ENCODING)
        await before.reconcile("t", None, conversation(2, "another session"), MODEL, ENCODING)

        restarted = History(db, clock=Clock())
        resent = opened_session(*turns, "Turn 4")
        resent[4] = {**resent[4], "content": "<tool_output_masked>\nline 1\n</tool_output_masked>"}
        del resent[2]
        second = await restarted.reconcile("t", session_id, resent, MODEL, ENCODING)

        assert second.session.id == first.session.id
        assert [m.id for m in second.path[: len(first.path)]] == [m.id for m in first.path]
        assert second.stored_before == len(first.path)
        assert len(second.path) == len(first.path) + 4


async def test_a_request_leaving_out_a_later_message_or_not_resending_the_whole_path_is_another_branch(
    history: History,
) -> None:
    """Only the opening user turns may be left out, and only by a request that re-sends the rest of the path
    whole: a message dropped further on is an edit, a branch of its own, as before."""
    first = await history.reconcile("t", None, opened_session("Turn 1", "Turn 2", "Turn 3"), MODEL, ENCODING)
    later = opened_session("Turn 1", "Turn 2", "Turn 3", "Turn 4")
    del later[6]  # "Turn 2"
    edited = await history.reconcile("t", None, later, MODEL, ENCODING)
    assert edited.stored_before == 6
    assert len(edited.path) == len(later)

    shorter = opened_session("Turn 1", "Turn 2", "Turn 3")[:8]
    del shorter[2]
    cut = await history.reconcile("t", None, [*shorter, {"role": "user", "content": "Another way"}], MODEL, ENCODING)
    assert cut.stored_before == 2
    assert cut.path[2].message["role"] == "assistant"
    assert first.path[2].message["content"] == "Turn 1"


def test_a_derived_session_stays_one_when_a_request_names_it() -> None:
    """A request continuing an answer by its id names that answer's session; when the session is a derived one,
    the next request without a session id (Codex's next turn, the whole input) still finds its cached path."""
    recent = RecentPaths()
    key = ("t", "derived", ENCODING)
    first = [cached_entry(depth, "a") for depth in range(4)]
    messages = [entry.private for entry in first]
    recent.put(key, first, derived=True, sent=(messages, len(messages)))
    recent.put(key, first, derived=False, sent=(messages, len(messages)))

    found = recent.match("t", ENCODING, None, messages)

    assert (found.session_id, found.whole) == ("derived", True)
