"""Summary texts: the summarizer prompt, tool-output reduction and the deterministic extractive fallback."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.compaction.extractive import extractive_summary
from proxy.compaction.sections import ORDER
from proxy.compaction.summary_text import (
    SUMMARY_HEADER,
    key_inputs,
    reduce_tool_output,
    summarizer_messages,
    summary_message,
    target_tokens,
)
from proxy.tokens import count_text

FILLER = (
    "Sure, happy to help with that. Let me think about it for a moment. "
    "That sounds like a good plan overall and I agree it is reasonable. "
)


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def long_log(lines: int = 3_000) -> str:
    body = [f"collecting item {i} of the suite, all fine here" for i in range(lines)]
    body[1_200] = "WARNING: deprecated option --foo"
    body[2_000] = "Traceback (most recent call last): KeyError: 'user_id'"
    return "\n".join(["$ pytest -q", *body, "12 passed, 3 failed in 4.2s", "exit code 1"])


PLANTED: list[dict[str, Any]] = [
    {"role": "system", "content": SUMMARY_HEADER + "\nThe user is building a proxy called context-infinity."},
    {"role": "user", "content": FILLER * 3 + "Please set DATABASE_URL=postgres://db:5432/app for the tests."},
    {"role": "assistant", "content": None, "tool_calls": [call("c1", "read_file", path="src/proxy/app.py")]},
    {"role": "tool", "tool_call_id": "c1", "content": FILLER * 2 + "\nerror: connection refused"},
    {
        "role": "assistant",
        "content": [{"type": "text", "text": FILLER + "We decided to use httpx for the calls."}],
    },
    {"role": "user", "content": FILLER * 2 + "TODO: add retries to forward_request()."},
    {"role": "assistant", "content": FILLER * 4},
]


# --- summary message and target -----------------------------------------------------------------------------


def test_summary_message_is_a_user_message_with_the_header() -> None:
    expected = {"role": "user", "content": "[Earlier conversation summary]\nfacts", "origin": "summary"}
    assert summary_message("facts") == expected


@pytest.mark.parametrize(
    ("original", "expected"), [(0, 64), (100, 64), (1_000, 150), (10_001, 1_501), (100_000, 2_048)]
)
def test_target_is_fifteen_percent_clamped(original: int, expected: int) -> None:
    assert target_tokens(original) == expected


def test_target_takes_its_ratio_and_bounds_as_parameters() -> None:
    assert target_tokens(1_000, ratio=0.5, low=10, high=400) == 400
    assert target_tokens(10, ratio=0.5, low=10, high=400) == 10


# --- summarizer prompt --------------------------------------------------------------------------------------


def test_summarizer_prompt_instructs_then_gives_the_transcript() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Run the tests please."},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "run", command="pytest -q")]},
        {"role": "tool", "tool_call_id": "c1", "content": long_log()},
        {"role": "assistant", "content": [{"type": "text", "text": "Three tests fail."}]},
        {"role": "user", "content": None},
    ]
    prompt = summarizer_messages(messages, 300)
    assert [m["role"] for m in prompt] == ["system", "user"]
    instruction = prompt[0]["content"]
    assert "300 tokens" in instruction
    assert "chronological" in instruction
    for kept in ("decision", "file path", "error", "open task", "preamble", "newest value"):
        assert kept in instruction
    for section in ORDER:
        assert f"\n{section}: " in instruction, "the model is asked for the sections the fallback writes"
    transcript = prompt[1]["content"]
    assert "USER: Run the tests please." in transcript
    assert 'run({"command": "pytest -q"})' in transcript
    assert "ASSISTANT: Three tests fail." in transcript
    assert transcript.index("Run the tests") < transcript.index("pytest -q") < transcript.index("Three tests")
    assert "KeyError: 'user_id'" in transcript
    assert "12 passed, 3 failed" in transcript
    assert "collecting item 1500 " not in transcript
    assert count_text(transcript) < 1_000


def test_summarizer_prompt_renders_earlier_summaries() -> None:
    prompt = summarizer_messages([summary_message("Alice chose SQLite."), {"role": "user", "content": "Hi"}], 64)
    transcript = prompt[1]["content"]
    assert "Earlier summary: Alice chose SQLite." in transcript
    assert SUMMARY_HEADER not in transcript


def test_summarizer_prompt_shortens_huge_tool_call_arguments() -> None:
    huge = call("c1", "write_file", path="src/big.py", content="x = 1\n" * 5_000)
    transcript = summarizer_messages([{"role": "assistant", "content": None, "tool_calls": [huge]}], 64)[1]["content"]
    assert "write_file(path=src/big.py" in transcript
    assert len(transcript) < 1_000


# --- tool output reduction ----------------------------------------------------------------------------------


def test_short_tool_output_is_unchanged() -> None:
    assert reduce_tool_output("run", None, "ok\n2 passed", 50) == "ok\n2 passed"


@pytest.mark.parametrize("limit", [30, 60, 120, 400])
def test_long_tool_output_keeps_tool_inputs_and_outcome_within_the_limit(limit: int) -> None:
    arguments = json.dumps({"command": "pytest -q", "cwd": "/srv", "env": {"A": "1"}, "verbose": True})
    reduced = reduce_tool_output("run_shell", arguments, long_log(), limit)
    assert count_text(reduced) <= limit
    assert reduced.startswith("[run_shell(command=pytest -q) output reduced: 3003 lines]")
    assert "cwd" not in reduced
    assert "verbose" not in reduced
    if limit >= 60:
        assert "Traceback (most recent call last): KeyError: 'user_id'" in reduced
        assert "exit code 1" in reduced
    if limit >= 120:
        assert "12 passed, 3 failed in 4.2s" in reduced
        assert "$ pytest -q" in reduced
        assert "WARNING: deprecated option --foo" in reduced


def test_reduction_marks_the_lines_it_left_out() -> None:
    reduced = reduce_tool_output("run", None, long_log(), 120)
    assert "... (" in reduced
    assert " lines)" in reduced


def test_reduction_within_a_tiny_limit_and_of_one_huge_line() -> None:
    assert count_text(reduce_tool_output("a_tool_with_a_long_name", None, "y" * 50_000, 3)) <= 3
    reduced = reduce_tool_output("fetch", json.dumps({"url": "https://x.test/a"}), "{" + '"k": 1, ' * 9_000, 60)
    assert count_text(reduced) <= 60
    assert "url=https://x.test/a" in reduced


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (None, ""),
        ("", ""),
        (
            '{"path": "a.py", "query": "x", "id": 7, "flag": true, "content": "long"}',
            "path=a.py, query=x, id=7",
        ),
        ('{"nested": {"path": "a.py"}}', ""),
        ("not json", "not json"),
        ("[1, 2]", "[1, 2]"),
    ],
)
def test_key_inputs(arguments: str | None, expected: str) -> None:
    assert key_inputs(arguments) == expected


# --- extractive fallback ------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [64, 100, 200])
def test_fallback_keeps_planted_facts_within_the_target(target: int) -> None:
    summary = extractive_summary(PLANTED, target)
    assert count_text(summary) <= target
    for fact in ("DATABASE_URL=postgres://db:5432/app", "src/proxy/app.py", "error: connection refused"):
        assert fact in summary
    if target >= 100:
        assert "We decided to use httpx" in summary
        assert "TODO: add retries to forward_request()" in summary
    assert "happy to help" not in summary or target >= 200


def test_fallback_is_chronological_and_labelled_by_role() -> None:
    lines = extractive_summary(PLANTED, 200).splitlines()
    assert lines[0].startswith("summary: The user is building")
    assert lines[1] == "user: Please set DATABASE_URL=postgres://db:5432/app for the tests."
    assert lines[2] == "assistant: called read_file(path=src/proxy/app.py)"
    assert "tool read_file: error: connection refused" in lines


def test_fallback_is_deterministic() -> None:
    assert extractive_summary(PLANTED, 90) == extractive_summary(list(PLANTED), 90)


def test_fallback_of_pure_chatter_is_the_first_sentences() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hello there! How are you"},
        {"role": "assistant", "content": "Fine."},
    ]
    assert extractive_summary(messages, 64) == "user: Hello there!\nassistant: Fine."


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": None}],
        [{"role": "user", "content": []}],
        [{"role": "assistant", "content": "   "}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}],
    ],
)
def test_fallback_is_never_empty_for_messages_without_text(messages: list[dict[str, Any]]) -> None:
    summary = extractive_summary(messages, 64)
    assert summary
    assert count_text(summary) <= 64


def test_fallback_of_nothing_is_empty_and_targets_are_at_least_one_token() -> None:
    assert extractive_summary([], 64) == "0 earlier messages"
    assert 1 <= count_text(extractive_summary(PLANTED, 0)) <= 1


@pytest.mark.parametrize(
    ("sentence", "facts"),
    [
        ("We use DEPLOY_REGION=eu-west-3, then deploy.", ["DEPLOY_REGION=eu-west-3"]),
        ("Set (retry_limit = 7) for now.", ["retry_limit = 7"]),
        ("The limit is api_timeout_ms: 4500 on mobile.", ["api_timeout_ms: 4500"]),
        ('Set `LOG_LEVEL=debug` and name = "two words" here.', ["LOG_LEVEL=debug", 'name = "two words"']),
        ("Error: 404 came back.", ["Error: 404"]),
        ("Note: the thing is slow.", []),
        ("See https://x.test/search?q=foo&page=2 for it.", []),
        ("It fails if a == b or a => b.", []),
        ("Then x = compute(y) runs.", []),
    ],
)
def test_fallback_lists_facts_as_they_were_written(sentence: str, facts: list[str]) -> None:
    listed = "facts: " + "; ".join(facts)
    summary = extractive_summary([{"role": "user", "content": sentence}], count_text(listed) + 2)
    assert summary.splitlines()[0] == listed if facts else not summary.startswith("facts:")


def test_facts_of_an_earlier_summary_are_read_back_and_its_lines_keep_their_labels() -> None:
    earlier = summary_message("facts: A_KEY=1; b_key = two\nuser: We decided to use httpx.\nsummary: user: Old line.")
    messages = [earlier, {"role": "user", "content": "Also set C_KEY=3 please."}]
    merged = extractive_summary(messages, 64)
    assert merged.splitlines() == [
        "facts: A_KEY=1; b_key = two",
        "Facts (dated):",
        "summary: user: Old line.",
        "user: Also set C_KEY=3 please.",
        "Decisions:",
        "user: We decided to use httpx.",
    ]
    listed = "facts: A_KEY=1; b_key = two; C_KEY=3"
    tight = extractive_summary(
        [earlier, {"role": "user", "content": "Also set C_KEY=3 please."}], count_text(listed) + 2
    )
    assert tight == listed


def test_new_facts_leave_room_for_an_error_and_tool_outputs_are_not_read_for_facts() -> None:
    settings = " ".join(f"SETTING_{i}=value{i}." for i in range(40))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": settings},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "run", command="make")]},
        {"role": "tool", "tool_call_id": "c1", "content": "OUT_DIR=build\nerror: linker failed"},
    ]
    summary = extractive_summary(messages, 100)
    assert count_text(summary) <= 100
    assert summary.startswith("facts: SETTING_0=value0; SETTING_1=value1;")
    assert "tool run: error: linker failed" in summary
    assert "OUT_DIR=build" not in summary.splitlines()[0]


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=400)


@settings(max_examples=60, deadline=None)
@given(contents=st.lists(texts, min_size=1, max_size=6), target=st.integers(1, 300))
def test_property_fallback_stays_within_target_and_is_never_empty(contents: list[str], target: int) -> None:
    messages: list[dict[str, Any]] = [
        {"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(contents)
    ]
    summary = extractive_summary(messages, target)
    assert summary
    assert count_text(summary) <= target
    assert summary == extractive_summary(messages, target)


@settings(max_examples=40, deadline=None)
@given(output=texts, limit=st.integers(1, 200), name=st.none() | st.text(max_size=30))
def test_property_reduction_stays_within_limit(output: str, limit: int, name: str | None) -> None:
    assert count_text(reduce_tool_output(name, None, output * 20, limit)) <= limit
