"""The structured no-model summary of a conversation (issue 42): people, dated facts, decisions and open threads,
each sentence once with its date and speaker; an agent's session stays chronological; a newer value wins."""

from __future__ import annotations

from typing import Any

from proxy.compaction.extractive import extractive_summary
from proxy.compaction.sections import DECISIONS, FACTS, OPEN, PEOPLE, date_order, latest, read_header, section_of
from proxy.compaction.summary_text import summary_message
from proxy.tokens import count_text
from tests.unit.compaction.test_prose import date_of
from tests.unit.compaction.test_summary_text import PLANTED

DAY = "[8 May, 2023]"
CHAT: list[dict[str, Any]] = [
    {"role": "user", "content": "[1:56 pm on 8 May, 2023] Caroline: Hey Mel! How have you been?"},
    {"role": "assistant", "content": "Melanie: My cousin Vera adopted a beagle named Biscuit last week."},
    {"role": "user", "content": "Caroline: I ran the Leeds half marathon in 2 hours on Sunday."},
    {"role": "assistant", "content": "Melanie: We decided to sell the old Volvo after the crash in April."},
    {"role": "user", "content": "Caroline: Next month I'm planning a pottery course at the Riverside centre."},
    {"role": "assistant", "content": "Melanie: Thanks, Caroline! That sounds lovely."},
]
KEPT = {
    PEOPLE: "Melanie: My cousin Vera adopted a beagle named Biscuit last week.",
    FACTS: "Caroline: I ran the Leeds half marathon in 2 hours on Sunday.",
    DECISIONS: "Melanie: We decided to sell the old Volvo after the crash in April.",
    OPEN: "Caroline: Next month I'm planning a pottery course at the Riverside centre.",
}


def test_a_conversations_summary_has_its_sections_each_sentence_once_with_its_date_and_speaker() -> None:
    summary = extractive_summary(CHAT, 200)
    lines = summary.splitlines()
    assert count_text(summary) <= 200
    assert lines[0] == "People:"  # what was told of others; the speakers are named by their own lines
    headers = [lines.index(f"{section}:") for section in (FACTS, DECISIONS, OPEN)]
    assert headers == sorted(headers)
    for section, sentence in KEPT.items():
        assert lines.count(sentence) == 1
        start = lines.index(f"{section}:")
        ends = [index for index in headers if index > start]
        assert start < lines.index(sentence) < (ends[0] if ends else len(lines)), (section, summary)
        assert date_of(lines, sentence) == DAY
    assert "Thanks" not in summary
    assert "Hey Mel" not in summary


def test_a_chat_that_told_nothing_is_summarized_by_its_first_sentences_not_its_speakers() -> None:
    messages = [
        {"role": "user", "content": "Caroline: Hey Mel! Good to see you!"},
        {"role": "assistant", "content": "Melanie: Thanks, Caroline! Haha."},
    ]
    assert extractive_summary(messages, 200) == "user: Caroline: Hey Mel!\nassistant: Melanie: Thanks, Caroline!"


def test_a_structured_summary_merged_again_keeps_its_sections_and_lines() -> None:
    summary = extractive_summary(CHAT, 200)
    assert extractive_summary([summary_message(summary)], 200) == summary
    later = {"role": "user", "content": "Caroline: My brother Tom started a woodworking course in Hull."}
    merged = extractive_summary([summary_message(summary), later], 200).splitlines()
    for sentence in KEPT.values():
        assert sentence in merged
    assert date_of(merged, "Caroline: My brother Tom started a woodworking course in Hull.") == DAY


def test_an_agent_session_keeps_the_order_things_happened_in() -> None:
    lines = extractive_summary(PLANTED, 200).splitlines()
    assert not any(read_header(line) for line in lines)
    assert lines.index("assistant: called read_file(path=src/proxy/app.py)") < lines.index(
        "tool read_file: error: connection refused"
    )


def test_what_follows_a_summary_is_as_late_as_its_latest_date() -> None:
    """A summary's sections are not in the order of time: an undated message after it has its latest date, not
    the date of its last section."""
    earlier = summary_message(
        "People: Caroline, Melanie\nFacts (dated):\n[9 June, 2023]\nMelanie: My cousin Vera moved to Porto in March."
        "\nOpen threads:\n[8 May, 2023]\nCaroline: I'm planning a trip to Oslo next month."
    )
    told = "Caroline: I ran the Leeds half marathon in 2 hours."
    lines = extractive_summary([earlier, {"role": "user", "content": told}], 200).splitlines()
    assert date_of(lines, told) == "[9 June, 2023]"


def test_a_sentence_that_repeats_a_kept_one_is_not_kept_again_but_a_new_value_is() -> None:
    messages = [
        {"role": "user", "content": "Zoe: We finally moved, we live in Ashford now, boxes everywhere."},
        {"role": "assistant", "content": "Mila: Oh wow, you finally moved, you live in Ashford now!"},
        {"role": "user", "content": "Zoe: We finally moved again, we live in Millbrook now, boxes everywhere."},
    ]
    summary = extractive_summary(messages, 200)
    assert summary.count("Ashford") == 1
    assert "Millbrook" in summary


def test_the_newer_value_of_a_stated_fact_wins() -> None:
    messages = [
        {"role": "user", "content": "Please set retry_limit = 3 for the payment client."},
        {"role": "assistant", "content": "Done, the client now reads the setting at start-up."},
        {"role": "user", "content": "On second thought, retry_limit = 7 is safer."},
    ]
    summary = extractive_summary(messages, 12)
    assert "retry_limit = 7" in summary
    assert "retry_limit = 3" not in summary
    merged = extractive_summary([summary_message("facts: retry_limit = 3; LOG_LEVEL=debug"), messages[2]], 64)
    assert "retry_limit = 7" in merged
    assert "LOG_LEVEL=debug" in merged
    assert "retry_limit = 3" not in merged


def test_ordinary_words_are_not_tasks_in_a_conversation() -> None:
    """`next door` is no plan, `use` no decision: in a chat only the sections' own words make a line a decision or
    an open thread, so the kids next door do not outrank a neighbour's new beagle."""
    messages = [
        {"role": "user", "content": "Mila: The kids next door have started learning to skateboard, it's loud."},
        {"role": "assistant", "content": "Zoe: Oh, my neighbour Ravi just adopted a beagle, she named it Pickles."},
    ]
    summary = extractive_summary(messages, 30)
    assert "Pickles" in summary
    assert "skateboard" not in summary
    assert section_of("The kids next door have started learning to skateboard.", False) == FACTS


def test_sections_are_told_by_their_words() -> None:
    assert section_of("We decided to sell the old Volvo.", True) == DECISIONS
    assert section_of("I'm planning a pottery course next month.", False) == OPEN
    assert section_of("Did you finish the painting?", False) == OPEN
    assert section_of("My cousin Vera adopted a beagle.", True) == PEOPLE
    assert section_of("My cousin adopted a beagle.", False) == FACTS


def test_a_people_line_is_read_back_as_speakers_only_when_it_lists_names() -> None:
    assert read_header("People: Caroline, Melanie") == (PEOPLE, ("Caroline", "Melanie"))
    assert read_header("Decisions:") == (DECISIONS, ())
    assert read_header("People: Caroline, a counsellor; Melanie, her friend") is None
    assert read_header("Caroline: Decisions:") is None


def test_dates_are_ordered_where_they_can_be_read() -> None:
    assert date_order("8 May, 2023") == (2023, 5, 8)
    assert date_order("May 8, 2023") == (2023, 5, 8)
    assert date_order("1:56 pm on 8 May, 2023") == (2023, 5, 8)
    assert date_order("2023-05-08") == (2023, 5, 8)
    assert date_order("yesterday") is None
    assert latest(["9 June, 2023", "8 May, 2023"]) == "9 June, 2023"
    assert latest(["9 June, 2023", "last week"]) == "last week"
    assert latest([]) is None


def test_the_people_section_is_left_out_when_nothing_was_told_of_others() -> None:
    summary = extractive_summary([message for message in CHAT if "Vera" not in message["content"]], 200)
    assert "People" not in summary
    assert "Caroline: I ran the Leeds half marathon in 2 hours on Sunday." in summary
