"""The extractive fallback keeps facts (issue 15, "A fallback that keeps facts").

With the summarizer model down, every summary is the deterministic extractive fallback, and later compactions
merge earlier fallback summaries into wider ones. A 50-turn session of ordinary prose on a 4k-token model, with
15 `KEY=value`-style facts planted inside sentences, is driven through the real `Compactor` over a real SQLite
store: after the last turn, at least 12 of the 15 facts must still be visible in the working context. The
extractive summary that only ranked whole labelled sentences kept 9 of them: each merge of earlier summaries has
a small target (15 % of what it reads), and whole sentences of prose ("we should…") outranked the facts in it.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.budget.budgets import Budgets
from proxy.compaction.compactor import CompactionRequest, Compactor
from proxy.compaction.extractive import extractive_summary, fallback_summary
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer import FALLBACK_MODEL, Summarizer
from proxy.compaction.summary_text import SUMMARY_HEADER, summary_message
from proxy.compaction.working_context import WorkingContext
from proxy.config.models import ModelEntry
from proxy.config.schema import ContextConfig
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import content_text, count_message, count_text
from tests.support.scripted_upstream import Call, ScriptedUpstream, server_error

TENANT = "t"
ENCODING = "cl100k_base"
SMALL = ModelEntry(name="small", model="openai/small-4k", context_window=4_096)
"""A 4k-token model: its output limit defaults to half the window, so about 1,800 tokens of input remain."""
TURNS = 70
REQUIRED = 12

FACTS: dict[int, tuple[str, str]] = {
    2: ("DEPLOY_REGION=eu-west-3", "For the record, we settled on DEPLOY_REGION=eu-west-3 after the latency tests."),
    5: ("retry_limit = 7", "I would also like retry_limit = 7 for the payment client, the old value was too low."),
    8: ("DB_POOL_SIZE=24", "Ops asked that DB_POOL_SIZE=24 be the default now that the database has more cores."),
    11: ("cache_ttl_seconds = 900", "Keep cache_ttl_seconds = 900 for the catalogue pages, marketing agreed."),
    14: ("LOG_LEVEL=warning", "In production we run with LOG_LEVEL=warning because the info logs were far too noisy."),
    17: ("max_upload_mb: 250", "The product team wants max_upload_mb: 250 so that customers can send longer videos."),
    20: ("FEATURE_SEARCH=on", "Turn FEATURE_SEARCH=on for the beta customers only, the others wait for the launch."),
    23: ("worker_count = 12", "We measured the queue again and worker_count = 12 keeps up with the evening peak."),
    26: ("BACKUP_BUCKET=s3://acme-backups", "Nightly dumps go to BACKUP_BUCKET=s3://acme-backups from next week on."),
    29: ("api_timeout_ms: 4500", "The mobile team asked for api_timeout_ms: 4500 on slow networks, which seems fair."),
    32: ("SENTRY_SAMPLE_RATE=0.25", "Finance approved SENTRY_SAMPLE_RATE=0.25, anything higher costs too much."),
    35: ("release_branch = release/2024.11", "Cut the release_branch = release/2024.11 on Friday afternoon."),
    38: ("QUEUE_NAME=orders-high", "Route the urgent orders through QUEUE_NAME=orders-high so they skip the backlog."),
    41: ("rotation_days: 30", "Security wants the session secret rotated, rotation_days: 30 is their requirement."),
    44: ("PRIMARY_DB_HOST=db-7.internal", "After the migration the PRIMARY_DB_HOST=db-7.internal is the one to use."),
}
"""User turn → (the fact string, the sentence it is planted in): every form a person writes a setting in."""

TOPICS = (
    "the onboarding flow",
    "the checkout page",
    "the weekly report",
    "the search results",
    "the admin dashboard",
    "the notification emails",
    "the mobile layout",
    "the billing history",
    "the returns form",
    "the product pages",
    "the help centre",
)
QUESTIONS = (
    "Could you look at {topic} again and tell me whether the wording still makes sense to a new customer?",
    "I keep hearing complaints about {topic}, so I would like a short plan for making it feel less confusing.",
    "Before the meeting tomorrow, can you write down what we already know about {topic} and what is still open?",
    "Our designer thinks {topic} has too many steps, and I am not sure whether she is right about that.",
    "Please review {topic} with accessibility in mind, since several users with screen readers wrote to us.",
    "What would you change first in {topic} if we only had two days for it?",
    "Can we make {topic} feel a bit more personal without asking customers for more data?",
)
CONTEXTS = (
    "The sales team has been asking about it all week and I promised them an answer by Thursday.",
    "Nothing is broken as far as I can tell, it just feels slower and clumsier than it should.",
    "We do not need a perfect answer, a reasonable first step would already help a lot.",
    "I would rather change a little at a time than rewrite everything at once.",
    "About 30 people mentioned it in the last survey, which is more than I expected.",
    "We need to keep the budget small this quarter, so nothing that needs a new supplier.",
    "Next week is busy for me, so anything you can prepare now saves us time later.",
    "Maria from support says it comes up in maybe one ticket out of ten.",
)
OPENINGS = (
    "I read through {topic} carefully and most of it holds up well.",
    "There are a few places in {topic} where the language is more technical than it needs to be.",
    "Looking at {topic} from the point of view of a first-time visitor, the layout is fine.",
    "My suggestion for {topic} is to start small and measure before we plan anything larger.",
    "I compared {topic} with what two of our competitors do, and we are not far behind.",
    "The good news is that {topic} needs polish rather than a redesign.",
)
MIDDLES = (
    "The main problem is that the first screen asks for too much at once, so people hesitate before they see "
    "any value.",
    "Customers do not know our internal names for things, and they should not have to.",
    "People look for the summary first and the details later, but the page shows them the other way round.",
    "We should fix the labels, check the contrast of the buttons, and make sure every field works with a keyboard.",
    "Three of the five steps could be merged into one without losing anything important.",
    "The text uses a different tone in every section, which makes it feel like it was written by committee.",
    "It loads quickly enough, but the spinner appears even when nothing is loading, which looks like a fault.",
)
CLOSINGS = (
    "If you agree, I will draft the new wording so you can show it to the team.",
    "After that we can ask a handful of customers to try it and see what still trips them up.",
    "That change is cheap and will probably reduce the questions that reach the support team.",
    "We could try it on ten percent of visitors first and compare the numbers after a week.",
    "I would leave the rest alone until we hear back from the people who complained.",
    "Let me know which of these matters most to you and I will start there.",
)


def user_turn(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    sentences = [QUESTIONS[turn % len(QUESTIONS)].format(topic=topic), CONTEXTS[(turn * 3) % len(CONTEXTS)]]
    if turn in FACTS:
        sentences.insert(1, FACTS[turn][1])
    return " ".join(sentences)


def answer(turn: int) -> str:
    topic = TOPICS[(turn + 3) % len(TOPICS)]
    middles = [MIDDLES[(turn * 2 + step) % len(MIDDLES)] for step in range(3)]
    parts = (OPENINGS[turn % len(OPENINGS)], *middles, CLOSINGS[(turn * 5) % len(CLOSINGS)])
    return " ".join(part.format(topic=topic) for part in parts)


def visible(prepared: WorkingContext) -> list[str]:
    """The planted facts the working context still shows, key and value as they were written."""
    context = "\n".join(content_text(message.get("content")) for message in prepared.messages)
    return [fact for fact, _ in FACTS.values() if fact in context]


async def session_with_the_summarizer_down(db: Database, config: ContextConfig) -> WorkingContext:
    """TURNS user turns through the real compactor and summarizer, whose model refuses every call."""
    upstream = ScriptedUpstream()

    def refuse(call: Call) -> None:
        upstream.refuse(server_error("The summarizer is down."))

    upstream.on_call = refuse
    budgets = Budgets((SMALL,), lambda model: None, config.safety_margin)
    summaries = SpanStore(db)
    compactor = Compactor(config, summaries, Summarizer(upstream, None, budgets, config))
    history = History(db)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help a small web shop run its product."}]
    prepared: WorkingContext | None = None
    for turn in range(1, TURNS + 1):
        messages.append({"role": "user", "content": user_turn(turn)})
        path = (await history.reconcile(TENANT, "s", messages, SMALL.model, ENCODING)).path
        request = CompactionRequest(
            tenant=TENANT,
            session_id="s",
            messages=messages,
            path=path,
            entry=SMALL,
            encoding=ENCODING,
            budget=budgets.budget(SMALL).input_budget,
            preserve_recent=config.preserve_recent,
        )
        prepared = await compactor.prepare(request)
        assert prepared.tokens <= request.budget
        messages.append({"role": "assistant", "content": answer(turn)})
    assert prepared is not None
    written = await summaries.on_path(TENANT, path)
    assert written, "the session never compacted: the test measures nothing"
    assert {(s.generated_by, s.model) for s in written} == {("fallback", FALLBACK_MODEL)}
    assert any(s.replaces for s in written), "no fallback summary was ever merged into a wider one"
    assert upstream.calls, "the summarizer was never asked"
    return prepared


@pytest.fixture
def config() -> ContextConfig:
    return ContextConfig(strategies=("summarize",))


async def test_most_planted_facts_survive_seventy_turns_of_fallback_summaries(
    db: Database, config: ContextConfig
) -> None:
    prepared = await session_with_the_summarizer_down(db, config)

    kept = visible(prepared)
    assert prepared.summaries >= 1
    assert len(kept) >= REQUIRED, f"{len(kept)}/{len(FACTS)} facts visible: {kept}"


# --- focused: the fallback's choices -------------------------------------------------------------------------

PROSE = (
    "Sure, that sounds like a reasonable way to approach it and I am happy to help with the rest of the work. "
    "Let me think about how the pieces fit together before we change anything in a hurry."
)


def fallback_of(turns: range, target: int) -> str:
    messages: list[dict[str, Any]] = []
    for turn in turns:
        messages += [{"role": "user", "content": user_turn(turn)}, {"role": "assistant", "content": answer(turn)}]
    return extractive_summary(messages, target)


def test_facts_outrank_prose() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": PROSE + " " + FACTS[2][1] + " " + PROSE},
        {"role": "assistant", "content": PROSE * 3},
        {"role": "user", "content": PROSE + " " + FACTS[5][1] + " " + FACTS[17][1]},
    ]
    summary = extractive_summary(messages, 40)
    assert count_text(summary) <= 40
    for turn in (2, 5, 17):
        assert FACTS[turn][0] in summary
    assert "happy to help" not in summary


def test_a_merge_of_two_fallback_summaries_keeps_both_summaries_facts() -> None:
    first = fallback_of(range(1, 13), 120)
    second = fallback_of(range(13, 25), 120)
    planted = [FACTS[turn][0] for turn in FACTS if turn < 25]
    assert all(fact in first + second for fact in planted)

    new_turns: list[dict[str, Any]] = []
    for turn in range(25, 29):
        new_turns += [{"role": "user", "content": user_turn(turn)}, {"role": "assistant", "content": answer(turn)}]
    merged = extractive_summary([summary_message(first), summary_message(second), *new_turns], 120)

    assert count_text(merged) <= 120
    assert [fact for fact in planted if fact not in merged] == []
    assert FACTS[26][0] in merged


def test_merging_again_and_again_neither_loses_facts_nor_grows() -> None:
    summary = fallback_of(range(1, 9), 100)
    for _ in range(5):
        again = extractive_summary([summary_message(summary)], 100)
        assert again == summary
    assert SUMMARY_HEADER not in summary


@pytest.mark.parametrize("target", [1, 8, 30, 64, 150, 400])
def test_the_fallback_stays_within_its_target(target: int) -> None:
    summary = fallback_of(range(1, 30), target)
    assert summary
    assert count_text(summary) <= target


@pytest.mark.parametrize("replaced", [30, 60, 200, 800])
def test_the_fallback_message_costs_less_than_what_it_replaces(replaced: int) -> None:
    messages = [{"role": "user", "content": user_turn(turn)} for turn in range(1, 30)]
    content = fallback_summary(messages, 1_000, replaced, ENCODING)
    assert content
    assert count_message(summary_message(content), ENCODING) < replaced
