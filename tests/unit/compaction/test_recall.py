"""Recall (`proxy.compaction.recall`): excerpts and the recall message as pure functions; the FTS5 index and
ranking on a real SQLite file, with messages stored through `History`. Query terms: `test_recall_terms`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any, cast

import pytest

from proxy.compaction import recall as recall_module
from proxy.compaction import recall_index
from proxy.compaction.excerpts import excerpt, message_text
from proxy.compaction.recall import (
    MAX_HITS,
    MAX_PASSAGE_CHARS,
    RECALL_HEADER,
    Passage,
    Recall,
    recall_message,
)
from proxy.history.messages import StoredMessage
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import content_text, count_message, count_text

ENCODING = "cl100k_base"
MODEL = "gpt-4"
QUESTION = "what was the DEPLOY_REGION we agreed on?"
FACT = "DEPLOY_REGION=eu-west-3"
FILLER = "the proxy keeps every message and sends a working context that fits the model window"
NASTY_QUERIES = [
    'say "hello',
    "DEPLOY_REGION*",
    "NEAR(deploy region, 2)",
    "text:DEPLOY_REGION",
    "-DEPLOY_REGION",
    "deploy AND OR NOT region",
    '"" ^ * : - + ( ) { } NEAR/3',
    "\x00\ufffd\U0001f600 ☃ ß İ",
    "x" * 10_000,
]


def conversation(turns: int, fact_turn: int = 3, fact: str = FACT) -> list[dict[str, Any]]:
    """A system message, then `turns` user/assistant turns; the user message of `fact_turn` plants `fact`."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(turns):
        planted = f" Let's settle it: {fact} for the staging cluster." if turn == fact_turn else ""
        messages.append({"role": "user", "content": f"question {turn}: {FILLER}.{planted}"})
        messages.append({"role": "assistant", "content": f"answer {turn}: {FILLER}."})
    return messages


def visible(path: Sequence[StoredMessage], hidden: Sequence[int]) -> str:
    return "\n".join(content_text(m.message.get("content")) for i, m in enumerate(path) if i not in set(hidden))


def shown(path: Sequence[StoredMessage], hidden: Sequence[int]) -> set[int]:
    """The positions a working context sends verbatim: all but `hidden`."""
    return set(range(len(path))).difference(hidden)


def user_position(turn: int) -> int:
    return 1 + 2 * turn


@pytest.fixture
def history(db: Database) -> History:
    return History(db)


@pytest.fixture
def recall(db: Database) -> Recall:
    return Recall(db)


async def stored(history: History, messages: list[dict[str, Any]], tenant: str = "t") -> list[StoredMessage]:
    return (await history.reconcile(tenant, "s", messages, MODEL, ENCODING)).path


async def count(db: Database, sql: str) -> int:
    row = await db.fetchone(sql)
    assert row is not None
    return int(row[0])


# --- the pure parts ----------------------------------------------------------------------------------------------


def test_a_long_text_gives_an_excerpt_of_whole_lines_around_the_best_match() -> None:
    lines = [f"line {n}: {FILLER}" for n in range(2000)]
    lines[1200] = f"line 1200: here it is, {FACT}, and the deploy target"
    lines[300] = "line 300: region only"
    text = "\n".join(lines)
    cut = excerpt(text, [("deploy", "region"), ("eu", "west", "3"), ("region",)], 600)
    assert FACT in cut
    assert len(cut) <= 600 + 4
    assert cut.startswith("… line ")
    assert cut.endswith(" …")
    assert excerpt("short text", [("deploy",)], 600) == "short text"
    assert excerpt(text, [("absent",)], 600).startswith("line 0:")


def test_message_text_holds_tool_calls_and_ignores_non_text_parts() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "image_url", "image_url": {"url": "data:x"}}, {"type": "text", "text": "checking"}],
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}],
    }
    assert message_text(message) == 'checking\nshell {"cmd": "ls"}'
    assert message_text({"role": "user", "content": None, "tool_calls": "odd"}) == ""


def test_recall_message_is_deterministic() -> None:
    passages = [
        Passage(position=3, message_id="a", role="user", text=FACT, tokens=count_text(FACT, ENCODING)),
        Passage(position=9, message_id="b", role="tool", text="… output …", tokens=3),
    ]
    message = recall_message(passages)
    assert message == recall_message(list(passages))
    assert message["role"] == "user"
    content = message["content"]
    assert content.startswith(RECALL_HEADER + "\n\n")
    assert "Message 3 (user):\n" + FACT in content
    assert content.index("Message 3") < content.index("Message 9 (tool):")


# --- the index, on a real file -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "cap"), [(0, 10**9), (1, 10**9), (2, 1), (3, 1)])
async def test_a_session_s_hidden_messages_are_all_indexed_as_its_path_grows_and_its_shown_part_moves(
    db: Database, history: History, recall: Recall, monkeypatch: pytest.MonkeyPatch, seed: int, cap: int
) -> None:
    """What a session's last request left indexed carries over (`RecallIndex.index_hidden`): however its path
    grows, branches and what it shows moves (messages shown again, hidden again), every hidden message ends up
    indexed: at once, or, with one message indexed a call (`cap`), after as many calls with the same view."""
    monkeypatch.setattr(recall_index, "MAX_INDEX_CHARS", cap)
    rng = random.Random(seed)
    messages = conversation(3)
    for step in range(25):
        if rng.random() < 0.2 and len(messages) > 4:  # a branch, as long as the path it leaves: an edit
            at = rng.randrange(2, len(messages) - 1)
            edits = [{"role": "user", "content": f"edit {step} {n} {FILLER}"} for n in range(len(messages) - at)]
            messages = [*messages[:at], *edits]
        messages = [*messages, {"role": "user", "content": f"turn {step} {FILLER}"}]
        path = await stored(history, messages)
        visible = set(rng.sample(range(len(path)), rng.randrange(len(path) // 2)))
        for _ in range(len(path) if cap == 1 else 1):
            await recall.passages("t", "s", path, visible, "", QUESTION, 500, ENCODING)
        rows = await db.fetchall("SELECT message_id FROM recall_messages")
        hidden = {path[position].id for position in range(len(path)) if position not in visible}
        assert hidden <= {row[0] for row in rows}, step


async def test_messages_known_to_be_indexed_are_not_looked_up_again(
    db: Database, history: History, recall: Recall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session hides more of its history every turn: what this process indexed (or found indexed) is not
    asked about again, and recall finds the same passages."""
    path = await stored(history, conversation(8))
    hidden = list(range(1, 12))
    first = await recall.passages("t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING)
    lookups: list[str] = []
    fetchall = db.fetchall

    async def counted(sql: str, params: Sequence[Any] = ()) -> Any:
        if "FROM recall_messages WHERE" in sql:
            lookups.append(sql)
        return await fetchall(sql, params)

    monkeypatch.setattr(db, "fetchall", counted)
    again = await recall.passages("t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING)
    assert again == first
    assert lookups == []
    assert (
        await Recall(db).passages("t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING)
        == first
    )
    assert len(lookups) == 1  # a process that never saw them asks once


async def test_a_fact_only_in_hidden_history_is_recalled(history: History, recall: Recall) -> None:
    path = await stored(history, conversation(8))
    hidden = list(range(1, 12))
    passages = await recall.passages(
        "t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING
    )
    # The hit, with the hidden turns before and after it (the question it answers, the answer it got).
    assert [p.position for p in passages] == [user_position(3) - 1, user_position(3), user_position(3) + 1]
    [passage] = [p for p in passages if FACT in p.text]
    assert passage.message_id == path[user_position(3)].id
    assert passage.role == "user"
    assert passage.tokens == count_text(passage.text, ENCODING)


async def test_a_fact_the_working_context_shows_is_not_recalled(history: History, recall: Recall) -> None:
    path = await stored(history, conversation(8))
    hidden = [i for i in range(1, 12) if i != user_position(3)]
    assert (
        await recall.passages("t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING) == []
    )


async def test_a_message_that_is_not_hidden_is_never_returned(history: History, recall: Recall) -> None:
    path = await stored(history, conversation(8))
    hidden = [i for i in range(1, 12) if i != user_position(3)]
    # Even when the caller's visible text misses it (here: empty), only hidden messages are searched.
    assert await recall.passages("t", "s", path, shown(path, hidden), "", QUESTION, 500, ENCODING) == []
    # Indexed once as hidden, a message is still not returned once it is shown again.
    await recall.passages("t", "s", path, shown(path, [user_position(3)]), "", QUESTION, 500, ENCODING)
    assert await recall.passages("t", "s", path, shown(path, hidden), "", QUESTION, 500, ENCODING) == []


async def test_tenants_are_separated(history: History, recall: Recall) -> None:
    ours = await stored(history, conversation(8), tenant="a")
    theirs = await stored(history, conversation(8, fact="nothing planted"), tenant="b")
    hidden = list(range(1, 12))
    assert await recall.passages("a", "s", ours, shown(ours, hidden), "", QUESTION, 500, ENCODING)
    assert await recall.passages("b", "s", theirs, shown(theirs, hidden), "", QUESTION, 500, ENCODING) == []
    # Another tenant's ids are not found under this tenant's name, indexed or not.
    assert await recall.passages("b", "s", ours, shown(ours, []), "", QUESTION, 500, ENCODING) == []
    assert await recall.passages("c", "s", theirs, shown(theirs, hidden), "", QUESTION, 500, ENCODING) == []


async def test_fts_syntax_in_the_query_does_not_raise(history: History, recall: Recall) -> None:
    path = await stored(history, conversation(8))
    for query in NASTY_QUERIES:
        passages = await recall.passages("t", "s", path, shown(path, list(range(1, 12))), "", query, 500, ENCODING)
        assert all(isinstance(p, Passage) for p in passages)


async def test_odd_input_gives_no_passages(db: Database, history: History, recall: Recall) -> None:
    path = await stored(history, conversation(8))
    assert await recall.passages("t", "s", path, shown(path, []), "", QUESTION, 500, ENCODING) == []
    assert await recall.passages("t", "s", path, shown(path, [-1, 99, len(path)]), "", QUESTION, 500, ENCODING) == []
    assert await recall.passages("t", "s", [], shown([], [0, 1]), "", QUESTION, 500, ENCODING) == []
    assert await recall.passages("t", "s", path, shown(path, [1, 2]), "", "", 500, ENCODING) == []
    assert await recall.passages("t", "s", path, shown(path, [1, 2]), "", "? the and ...", 500, ENCODING) == []
    assert await recall.passages("nobody", "s", path, shown(path, [1, 2]), "", QUESTION, 500, ENCODING) == []
    # A message that is not in the store (a caller's mistake) cannot be indexed: no passages, no exception.
    ghost = StoredMessage("f" * 64, None, 0, "user", {"role": "user", "content": FACT}, 5, 0.0)
    assert await recall.passages("t", "s", [ghost], shown([ghost], [0]), "", QUESTION, 500, ENCODING) == []
    parts = await stored(history, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert await recall.passages("t", "s", parts, shown(parts, [0]), "", QUESTION, 500, ENCODING) == []


async def test_no_limit_does_not_touch_the_database(history: History) -> None:
    path = await stored(history, conversation(8))
    untouchable = Recall(cast(Database, object()))
    for limit in (0, -5):
        assert (
            await untouchable.passages("t", "s", path, shown(path, list(range(1, 12))), "", QUESTION, limit, ENCODING)
            == []
        )


async def test_the_limit_is_respected(history: History, recall: Recall) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(30):
        messages.append({"role": "user", "content": f"turn {turn}: {FILLER}. {FACT} is set on host{turn}."})
        messages.append({"role": "assistant", "content": f"noted {turn}"})
    path = await stored(history, messages)
    hidden = list(range(1, 55))
    everything = await recall.passages("t", "s", path, shown(path, hidden), "", QUESTION, 100_000, ENCODING)
    assert 1 < len([p for p in everything if FACT in p.text]) <= MAX_HITS
    assert len(everything) <= 3 * MAX_HITS
    for limit in (1, 20, 60, 90, 200):
        passages = await recall.passages("t", "s", path, shown(path, hidden), "", QUESTION, limit, ENCODING)
        assert sum(p.tokens for p in passages) <= limit
        assert not passages or count_message(recall_message(passages), ENCODING) <= limit
        assert [p.position for p in passages] == sorted(p.position for p in passages)
    assert await recall.passages("t", "s", path, shown(path, hidden), "", QUESTION, 200, ENCODING)


async def test_a_huge_tool_output_gives_a_bounded_excerpt_holding_the_match(history: History, recall: Recall) -> None:
    line = "INFO worker ok: " + FILLER
    lines = [line] * 25_000
    lines[17_000] = f"INFO config loaded: {FACT} (from environment)"
    output = "\n".join(lines)
    assert len(output) > 2_000_000
    call = {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "deploy --dry"}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "run the dry deploy"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": QUESTION},
    ]
    path = await stored(history, messages)
    hidden = [1, 2, 3, 4]
    passages = await recall.passages(
        "t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 2_000, ENCODING
    )
    assert [p.position for p in passages] == [2, 3, 4]  # the call, its output, the answer after it
    passage = passages[1]
    assert FACT in passage.text
    assert len(passage.text) <= MAX_PASSAGE_CHARS + 4
    assert passage.text.startswith("… ")
    assert passage.text.endswith(" …")


async def test_indexing_twice_does_not_duplicate_rows(db: Database, history: History, recall: Recall) -> None:
    path = await stored(history, conversation(8))
    hidden = list(range(1, 12))
    await recall.passages("t", "s", path, shown(path, hidden), "", QUESTION, 500, ENCODING)
    assert await count(db, "SELECT COUNT(*) FROM recall_messages") == len(hidden)
    await asyncio.gather(
        *(
            recall.passages("t", "s", path, shown(path, [*hidden, 12, 13]), "", QUESTION, 500, ENCODING)
            for _ in range(3)
        ),
        Recall(db).passages("t", "s", path, shown(path, hidden), "", "staging cluster", 500, ENCODING),
    )
    assert await count(db, "SELECT COUNT(*) FROM recall_messages") == len(hidden) + 2
    assert await count(db, "SELECT COUNT(*) FROM recall_index") == len(hidden) + 2


async def test_a_term_only_in_tool_call_arguments_is_found(history: History, recall: Recall) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "kubectl rollout"}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "restart it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "which `kubectl` command did you run?"},
    ]
    path = await stored(history, messages)
    passages = await recall.passages(
        "t", "s", path, shown(path, [1, 2, 3]), "", "which `kubectl` command did you run?", 500, ENCODING
    )
    assert [p.position for p in passages] == [1, 2, 3]
    assert "kubectl rollout" in passages[1].text


@pytest.mark.parametrize(("ranked_first", "candidates", "sends_ids"), [(1, 32, True), (2, 2, True), (15, 2, False)])
async def test_the_hidden_messages_best_matches_are_found_however_many_are_ranked_first(
    db: Database,
    history: History,
    ranked_first: int,
    candidates: int,
    sends_ids: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tenant's best matches are asked for first and the hidden ones picked from them; when they may not hold
    the hidden ones' best, the hidden ids are sent. Either way the passages are those of ranking every match,
    also when another session's matches outrank every hidden one."""
    noisy = [{"role": "system", "content": "be brief"}]
    noisy += [{"role": "user", "content": f"{FACT} {FACT} {FACT} noise {turn}"} for turn in range(12)]
    other = (await history.reconcile("t", "other", noisy, MODEL, ENCODING)).path
    await Recall(db).passages(
        "t", "s", other, shown(other, list(range(len(other)))), "", QUESTION, 5000, ENCODING
    )  # indexed
    messages = [{"role": "system", "content": "be brief"}]
    for turn in range(10):
        messages.append({"role": "user", "content": f"question {turn}: {FILLER}. {FACT if turn % 3 == 0 else ''}"})
        messages.append({"role": "assistant", "content": f"answer {turn}: {FACT if turn % 4 == 1 else FILLER}."})
    path = await stored(history, messages)
    hidden = [position for position in range(1, 15) if position != user_position(3)]
    monkeypatch.setattr(recall_module, "MAX_CANDIDATES", candidates)
    monkeypatch.setattr(recall_module, "RANKED_FIRST", 10_000)  # every match at once
    every = await Recall(db).passages("t", "s", path, shown(path, hidden), "", QUESTION, 5000, ENCODING)
    monkeypatch.setattr(recall_module, "RANKED_FIRST", ranked_first)
    statements: list[str] = []
    fetchall = db.fetchall

    async def counted(sql: str, params: Sequence[Any] = ()) -> Any:
        statements.append(sql)
        return await fetchall(sql, params)

    monkeypatch.setattr(db, "fetchall", counted)
    assert await Recall(db).passages("t", "s", path, shown(path, hidden), "", QUESTION, 5000, ENCODING) == every
    assert every
    assert all(passage.position in hidden for passage in every)
    assert any("ORDER BY score" in sql and "json_each" in sql for sql in statements) == sends_ids


# --- ordinary language ---------------------------------------------------------------------------------------------

CHAT = [
    ("Caroline", "Hey Mel! Good to see you! How have you been?"),
    ("Melanie", "Hey Caroline! I'm swamped with the kids and work. What's up with you?"),
    ("Caroline", "I went to a LGBTQ support group yesterday and it was so powerful."),
    ("Melanie", "Wow, that's cool, Caroline! What happened that was so awesome?"),
    ("Caroline", "The transgender stories were so inspiring! I was so happy and thankful for all the support."),
    ("Melanie", "Glad you found that, Caroline. I painted a lake sunrise last year, it's special to me."),
    ("Caroline", "That's lovely! Painting is a fun way to express yourself."),
    ("Melanie", "Thanks, Caroline. We're thinking about going camping next month."),
    ("Caroline", "Researching adoption agencies is my dream now, I want to build a family."),
    ("Melanie", "Wow, that's great news! I bet you'll be an awesome mom."),
]


def chat(*later: str) -> list[dict[str, Any]]:
    """A system message, the chat's turns as user (Caroline) and assistant (Melanie) messages, then `later`
    turns about something else, alternating."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be a friendly companion"}]
    for speaker, said in CHAT:
        messages.append({"role": "user" if speaker == "Caroline" else "assistant", "content": f"{speaker}: {said}"})
    for index, said in enumerate(later):
        messages.append({"role": "assistant" if index % 2 else "user", "content": said})
    return messages


LATER = ("Caroline: The weather is nice today.", "Melanie: Indeed, we might go to the beach with the kids.")


async def test_an_ordinary_question_recalls_its_hidden_turn_with_the_turns_around_it(
    history: History, recall: Recall
) -> None:
    question = "When did Caroline go to the support group?"
    path = await stored(history, [*chat(*LATER), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    passages = await recall.passages(
        "t", "s", path, shown(path, hidden), visible(path, hidden), question, 500, ENCODING
    )
    by_position = {p.position: p.text for p in passages}
    assert {2, 3, 4} <= set(by_position)
    assert "LGBTQ support group yesterday" in by_position[3]
    assert by_position[2].startswith("Melanie: Hey Caroline!")
    assert by_position[4].startswith("Melanie: Wow, that's cool")
    assert set(by_position) <= {2, 3, 4, 5, 6}  # another turn about the support, with its neighbours at most


async def test_a_word_is_found_by_its_stem(history: History, recall: Recall) -> None:
    question = "What did Melanie say about her paintings?"
    path = await stored(history, [*chat(*LATER), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    passages = await recall.passages(
        "t", "s", path, shown(path, hidden), visible(path, hidden), question, 500, ENCODING
    )
    texts = [p.text for p in passages]
    assert any("I painted a lake sunrise" in t for t in texts)
    assert any("Painting is a fun way" in t for t in texts)


async def test_a_question_the_visible_context_covers_recalls_nothing(history: History, recall: Recall) -> None:
    """Never a hijack: a question whose every term the context shows gets no recall, however well the hidden
    history matches it."""
    question = "When did Caroline go to the support group?"
    later = ("Caroline: My group meets on Tuesdays.", "Melanie: And the support you get there?")
    path = await stored(history, [*chat(*later), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    view = visible(path, hidden)
    assert "support group" not in view.replace(question, "").lower()
    assert await recall.passages("t", "s", path, shown(path, hidden), view, question, 500, ENCODING) == []


async def test_a_passage_sharing_one_word_with_a_long_question_is_below_the_threshold(
    history: History, recall: Recall
) -> None:
    question = "Which bakery downtown sells the sourdough bread Caroline likes with her family?"
    path = await stored(history, [*chat(*LATER), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    view = visible(path, hidden)
    # `family` and `Caroline` are in hidden turns, but no turn holds half of what the question asks about.
    assert await recall.passages("t", "s", path, shown(path, hidden), view, question, 500, ENCODING) == []


async def test_neighbours_give_way_to_the_hit_when_the_limit_is_tight(history: History, recall: Recall) -> None:
    question = "When did Caroline go to the support group?"
    path = await stored(history, [*chat(*LATER), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    view = visible(path, hidden)
    whole = await recall.passages("t", "s", path, shown(path, hidden), view, question, 500, ENCODING)
    hit = [p for p in whole if p.position == 3]
    tight = count_message(recall_message(hit), ENCODING)
    passages = await recall.passages("t", "s", path, shown(path, hidden), view, question, tight, ENCODING)
    assert [p.position for p in passages] == [3]
    # A neighbour that is shown is not repeated.
    passages = await recall.passages(
        "t", "s", path, shown(path, [3, 4]), visible(path, [3, 4]), question, 500, ENCODING
    )
    assert [p.position for p in passages] == [3, 4]


# --- filling the room a turn has left ------------------------------------------------------------------------------


async def test_a_fill_brings_the_hidden_turns_sharing_a_word_then_the_latest_hidden_turns(
    history: History, recall: Recall
) -> None:
    """A question whose every term the context shows recalls nothing for itself; with `fill` the room is still
    used: the hidden turns sharing its words (with their neighbours) first, then the latest hidden turns back
    from the shown ones, without a gap, as far as they fit."""
    question = "When did Caroline go to the support group?"
    later = ("Caroline: My group meets on Tuesdays.", "Melanie: And the support you get there?")
    path = await stored(history, [*chat(*later), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    view = visible(path, hidden)
    assert await recall.passages("t", "s", path, shown(path, hidden), view, question, 500, ENCODING) == []

    related = await recall.passages("t", "s", path, shown(path, hidden), view, question, 130, ENCODING, fill=True)
    assert {2, 3, 4} <= {p.position for p in related}
    assert count_message(recall_message(related), ENCODING) <= 130

    roomy = await recall.passages("t", "s", path, shown(path, hidden), view, question, 5000, ENCODING, fill=True)
    assert [p.position for p in roomy] == hidden  # every hidden turn fits: all of them, in order

    unrelated = "And what about the weather?"
    path = await stored(history, [*chat(*later), {"role": "user", "content": unrelated}])
    view = visible(path, hidden)
    latest = await recall.passages("t", "s", path, shown(path, hidden), view, unrelated, 60, ENCODING, fill=True)
    positions = [p.position for p in latest]
    assert positions
    assert positions == list(range(11 - len(positions), 11))  # the latest hidden ones, no gap
    assert count_message(recall_message(latest), ENCODING) <= 60


async def test_a_fill_is_the_same_for_the_same_turn(history: History, recall: Recall) -> None:
    question = "What did Melanie say about her paintings?"
    path = await stored(history, [*chat(*LATER), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    view = visible(path, hidden)
    first = await recall.passages("t", "s", path, shown(path, hidden), view, question, 300, ENCODING, fill=True)
    again = await recall.passages("t", "s", path, shown(path, hidden), view, question, 300, ENCODING, fill=True)
    assert first == again
    assert recall_message(first) == recall_message(again)


async def test_what_the_question_asks_about_is_held_to_its_part_and_the_latest_turns_take_the_rest(
    history: History, recall: Recall
) -> None:
    """A large room (a chat's question, `recall_room`): the hits and the turns sharing the question's words
    within `asked_tokens`, the latest hidden turns after them up to the whole room."""
    question = "When did Caroline go to the support group?"
    path = await stored(history, [*chat(*LATER), {"role": "user", "content": question}])
    hidden = list(range(1, 11))
    view = visible(path, hidden)
    asked = await recall.passages("t", "s", path, shown(path, hidden), view, question, 130, ENCODING, fill=True)
    held = await recall.passages(
        "t", "s", path, shown(path, hidden), view, question, 5000, ENCODING, fill=True, asked_tokens=130
    )
    assert {p.position for p in asked} < {p.position for p in held}
    assert [p.position for p in held] == hidden  # the rest: the latest hidden turns, as far as they fit
    unheld = await recall.passages("t", "s", path, shown(path, hidden), view, question, 160, ENCODING, fill=True)
    assert {2, 3, 4} <= {p.position for p in unheld}
    latest = await recall.passages(
        "t", "s", path, shown(path, hidden), view, question, 160, ENCODING, fill=True, asked_tokens=0
    )
    positions = [p.position for p in latest]
    assert 2 not in positions
    assert positions == list(range(11 - len(positions), 11))  # nothing asked about: the latest hidden turns alone
