"""The extractive fallback on ordinary-language chat (issue 42): sentences kept for what they tell (names, numbers,
dates, new content words), not for their position or length; each with its date and speaker; greetings and
fillers dropped."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compaction.extractive import extractive_summary
from proxy.compaction.prose import date_stamp, information, speaker
from proxy.compaction.summary_text import summary_message
from proxy.tokens import count_text

MAY = "1:56 pm on 8 May, 2023"
JUNE = "7:55 pm on 9 June, 2023"
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
    assert lines.index(f"[{MAY}]") < lines.index("user: " + FACT_SENTENCES[0])
    assert lines.index(f"[{JUNE}]") < lines.index("assistant: " + FACT_SENTENCES[1])
    assert lines.index("user: " + FACT_SENTENCES[0]) < lines.index(f"[{JUNE}]")


def test_dates_survive_a_merge_of_fallback_summaries() -> None:
    first = extractive_summary(CHAT[:6], 60)
    second = extractive_summary(CHAT[6:], 60)
    merged = extractive_summary([summary_message(first), summary_message(second)], 80)
    lines = merged.splitlines()
    assert lines.index(f"[{MAY}]") < lines.index("user: " + FACT_SENTENCES[0]) < lines.index(f"[{JUNE}]")
    assert lines.index(f"[{JUNE}]") < lines.index("assistant: " + FACT_SENTENCES[1])
    assert extractive_summary([summary_message(merged)], 80) == merged
