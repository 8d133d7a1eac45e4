"""The extractive fallback on ordinary-language chat (issue 42): sentences kept for what they tell (names, numbers,
dates, new content words), not for their position or length; each with its date and speaker; greetings and
fillers dropped."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compaction.compactor import Compactor
from proxy.compaction.extractive import extractive_summary
from proxy.compaction.prose import date_in_force, date_stamp, information, short_date, speaker
from proxy.compaction.sections import read_header
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summary_text import summary_message
from proxy.config.schema import ContextConfig
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import count_text
from tests.unit.compaction.test_span_store import TENANT, FakeSummarizer, request, stored_path

MAY = "1:56 pm on 8 May, 2023"
JUNE = "7:55 pm on 9 June, 2023"
MAY_DAY, JUNE_DAY = "[8 May, 2023]", "[9 June, 2023]"
"""The date lines a summary shows for them: the day, without the time of day."""
CHAT: list[dict[str, Any]] = [
    {"role": "user", "content": f"[{MAY}] Caroline: Hey Mel! Good to see you! How have you been?"},
    {"role": "assistant", "content": "Melanie: Hey Caroline! Good to see you! I'm swamped with the kids & work."},
    {"role": "user", "content": "Caroline: Thanks, Mel."},
    {"role": "assistant", "content": "Melanie: Yeah, Caroline! Haha, totally."},
    {"role": "user", "content": "Caroline: I went to the LGBTQ support group at the Riverside centre yesterday."},
    {"role": "assistant", "content": "Melanie: That's so nice to hear. I love that for you."},
    {"role": "user", "content": f"[{JUNE}] Caroline: Hi Mel! Long time no talk, what's new?"},
    {"role": "assistant", "content": "Melanie: My cousin Vera adopted a beagle named Biscuit, he is adorable."},
    {"role": "user", "content": "Caroline: Aw, thanks Mel! That sounds lovely!"},
]
FACT_SENTENCES = (
    "Caroline: I went to the LGBTQ support group at the Riverside centre yesterday.",
    "Melanie: My cousin Vera adopted a beagle named Biscuit, he is adorable.",
)


def date_of(lines: list[str], kept: str) -> str | None:
    """The date line a kept sentence is shown under in its section (None: no date)."""
    for line in reversed(lines[: lines.index(kept)]):
        if read_header(line) is not None:
            return None
        if line.startswith("["):
            return line
    return None


PLEASANTRIES = ("Thanks, Mel.", "Yeah, Caroline!", "Hey Mel!", "Aw, thanks Mel!", "That sounds lovely!", "Haha")


@pytest.mark.parametrize(
    "sentence",
    ["Thanks, Maria.", "Yeah, John!", "Hey Mel! Good to see you!", "Haha, totally.", "That sounds lovely!"],
)
def test_greetings_and_fillers_tell_nothing(sentence: str) -> None:
    assert information(sentence, set()) == 0


def test_names_numbers_and_new_words_tell_more_than_small_talk() -> None:
    fact = information("My cousin Vera adopted a beagle named Biscuit in March.", set())
    talk = information("The weather turned, so we've been going on walks.", set())
    assert fact > talk > 0


def test_words_already_used_in_the_range_tell_less() -> None:
    sentence = "I baked sourdough bread with rosemary."
    assert information(sentence, {"baked", "sourdough", "bread", "rosemary"}) < information(sentence, set())


def test_a_date_stamp_and_a_speaker_are_read_off_a_line() -> None:
    assert date_stamp(f"[{MAY}] Caroline: Hey!") == (MAY, "Caroline: Hey!")
    assert date_stamp("[WIP] not a date") == (None, "[WIP] not a date")
    assert speaker("Caroline: I went there.") == ("Caroline", "I went there.")
    assert speaker("Error: connection refused") == (None, "Error: connection refused")
    assert speaker("Error: 404 came back.") == (None, "Error: 404 came back.")


def test_the_fallback_keeps_what_the_chat_told_and_drops_its_pleasantries() -> None:
    summary = extractive_summary(CHAT, 90)
    assert count_text(summary) <= 90
    for sentence in FACT_SENTENCES:
        assert sentence in summary, summary
    for pleasantry in PLEASANTRIES:
        assert pleasantry not in summary, summary


def test_information_wins_over_position_and_length() -> None:
    long_talk = (
        "Caroline: Work has been pretty hectic lately and the train was delayed again this morning, "
        "so I read a magazine about gardening, kitchens, furniture, recipes and holidays on the platform."
    )
    messages = [
        {"role": "user", "content": long_talk},
        {"role": "assistant", "content": "Melanie: My cousin Vera adopted a beagle named Biscuit."},
    ]
    summary = extractive_summary(messages, 40)
    assert "Biscuit" in summary
    assert "magazine" not in summary


def test_each_kept_sentence_shows_its_date_and_its_speaker() -> None:
    lines = extractive_summary(CHAT, 80).splitlines()
    assert date_of(lines, FACT_SENTENCES[0]) == MAY_DAY
    assert date_of(lines, FACT_SENTENCES[1]) == JUNE_DAY


def test_a_date_is_shown_without_its_time_of_day() -> None:
    assert short_date(MAY) == "8 May, 2023"
    assert short_date("10:31") == "10:31"
    assert short_date("9:00 am on the beach") == "9:00 am on the beach"
    assert short_date("2023-05-08") == "2023-05-08"


def test_dates_survive_a_merge_of_fallback_summaries() -> None:
    first = extractive_summary(CHAT[:6], 60)
    second = extractive_summary(CHAT[6:], 60)
    merged = extractive_summary([summary_message(first), summary_message(second)], 80)
    lines = merged.splitlines()
    assert date_of(lines, FACT_SENTENCES[0]) == MAY_DAY
    assert date_of(lines, FACT_SENTENCES[1]) == JUNE_DAY
    assert extractive_summary([summary_message(merged)], 80) == merged


def test_a_range_that_starts_after_its_date_stamp_keeps_the_date_in_force() -> None:
    later = CHAT[7:]  # June's session without its first, stamped message
    assert date_of(extractive_summary(later, 60).splitlines(), FACT_SENTENCES[1]) is None
    assert date_of(extractive_summary(later, 60, date=JUNE).splitlines(), FACT_SENTENCES[1]) == JUNE_DAY


def test_the_date_in_force_is_the_last_stamp_before_a_position() -> None:
    texts = [str(message["content"]) for message in CHAT]
    assert date_in_force(texts, 5) == MAY
    assert date_in_force(texts, 8) == JUNE
    assert date_in_force(texts, 0) is None
    assert date_in_force(["no stamp", "none here"], 2) is None


async def test_a_fallback_summary_of_a_later_part_of_a_session_shows_the_sessions_date(db: Database) -> None:
    history, summaries = History(db), SpanStore(db)
    compactor = Compactor(ContextConfig(max_summarizer_calls=0, strategies=("summarize",)), summaries, FakeSummarizer())
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(60):
        stamp = f"[{MAY}] " if turn == 0 else ""
        messages.append({"role": "user", "content": f"{stamp}Caroline: My neighbour Vera{turn} adopted a beagle."})
        messages.append({"role": "assistant", "content": f"Melanie: Our cousin Tom{turn} moved to Porto in June."})
        path = await stored_path(history, messages)
        await compactor.prepare(request(path, 1_200))

    written = await summaries.on_path(TENANT, path)
    later = [summary for summary in written if summary.start_depth > 1]
    assert later, "no summary started after the stamped message: the test measures nothing"
    assert all(summary.generated_by == "fallback" and MAY_DAY in summary.content for summary in later)


def test_small_talk_fills_at_most_half_a_summary() -> None:
    talk = [
        "I have been trying to cook more at home, mostly soups and stews.",
        "The garden is a mess, the slugs ate all my lettuce again.",
        "We finally fixed the leaky tap in the kitchen, what a relief.",
        "I cleaned out the attic and found all my old school notebooks.",
        "The kids next door started learning to skateboard, loud but sweet.",
        "I keep meaning to read more, but the evenings just disappear.",
    ]
    messages = [{"role": "user", "content": sentence} for sentence in talk]
    summary = extractive_summary(messages, 80)
    assert summary.count("\n") >= 1, "the small talk was not kept at all: the test measures nothing"
    assert count_text(summary) <= 40


@pytest.mark.parametrize(
    "sentence",
    [
        "No doubts, Caroline.",
        "That's a gorgeous photo, Caroline!",
        "Understand where you're at, Jon.",
        "Hey Caroline, since we last chatted, I've had a lot of things happening to me.",
        "Wow, Mel, I'm so stoked for you that art is helping you express yourself and bring you joy!",
        "Glad you have support, Caroline!",
        "Nice reminder, Gina!",
        "Thanks for askin', Gina!",
    ],
)
def test_a_name_called_out_to_the_other_speaker_tells_nothing(sentence: str) -> None:
    """A vocative (`…, Caroline!`, `Hey Caroline`) names the one spoken to, not someone the chat is about: these
    LoCoMo lines were kept by the fallback for their names."""
    assert information(sentence, set()) == 0


@pytest.mark.parametrize(
    "sentence",
    [
        "I went to a LGBTQ support group yesterday and it was so powerful.",
        "I ran a charity race for mental health last Saturday.",
        "Unfortunately, I also lost my job at Door Dash this month.",
        "Caroline and I went to the Riverside museum.",
        "Thanks to Vera, we adopted a beagle named Biscuit.",
    ],
)
def test_what_happened_to_whom_still_tells(sentence: str) -> None:
    assert information(sentence, set()) >= 2


def test_a_question_tells_less_than_the_same_words_stated() -> None:
    assert (
        0
        < information("Did you paint the lake sunrise in Oregon?", set())
        < information("I painted the lake sunrise in Oregon.", set())
    )


def test_a_stamp_on_a_later_line_of_a_message_dates_the_sentences_after_it() -> None:
    """A client that joins a speaker's consecutive turns into one message puts each session's stamp at a line's
    start: it dates what follows, and neither the stamp nor a greeting after it is kept as a sentence."""
    merged = (
        "Caroline: I went to the LGBTQ support group at the Riverside centre yesterday.\n"
        f"[{JUNE}] Caroline: Hey Melanie!\n"
        "Caroline: My cousin Vera adopted a beagle named Biscuit."
    )
    messages = [{"role": "user", "content": f"[{MAY}] Caroline: Hi!"}, {"role": "user", "content": merged}]
    lines = extractive_summary(messages, 80).splitlines()
    assert "Hey Melanie" not in "\n".join(lines)
    assert date_of(lines, FACT_SENTENCES[0]) == MAY_DAY
    assert date_of(lines, "Caroline: My cousin Vera adopted a beagle named Biscuit.") == JUNE_DAY


def test_the_date_in_force_may_be_stamped_on_a_later_line_of_a_message() -> None:
    joined = (
        f"Caroline: I went to the support group.\n[{JUNE}] Caroline: Hey Melanie!\nCaroline: Vera adopted a beagle."
    )
    assert date_in_force([f"[{MAY}] Caroline: Hi!", joined, "Melanie: Wow!"], 3) == JUNE
    assert date_in_force([f"[{MAY}] Caroline: Hi!", joined], 1) == MAY


def test_the_chat_s_speakers_named_in_its_lines_are_not_news() -> None:
    people = {"jon", "gina"}
    assert information("No doubt, Jon you've got this.", set(), people) == 0
    assert information("Sorry about your job Jon, but starting your own business sounds awesome!", set(), people) == 0
    assert information("Gina, Marley flooring is what dance studios use.", set(), people) >= 2
    messages = [
        {"role": "user", "content": "Jon: Sorry about your job Gin, but a dance studio of your own sounds awesome!"},
        {"role": "assistant", "content": "Gina: I lost my job at Door Dash this month."},
    ]
    summary = extractive_summary(messages, 60)
    assert "Door Dash" in summary
    assert "Sorry" not in summary


def test_what_happened_when_is_not_small_talk() -> None:
    """A sentence that says when (`yesterday`, `next month`) answers a question about time: it is not held to the
    small talk's half of a summary."""
    told = [
        "I went to a pottery workshop yesterday and made a little bowl.",
        "We are going camping by the lake next month with the kids.",
        "My brother started a woodworking course last week.",
        "The bakery on our street closed this morning after thirty years.",
        "I adopted two guinea pigs last weekend, they are shy.",
        "My sister moves to the coast next year for a nursing job.",
    ]
    messages = [{"role": "user", "content": sentence} for sentence in told]
    summary = extractive_summary(messages, 80)
    assert count_text(summary) > 40
