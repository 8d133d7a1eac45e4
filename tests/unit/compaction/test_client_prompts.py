"""The registry of client compaction prompts (`proxy.compaction.client_prompts`): each client's own prompt, as its
published version sends it, is recognized; ordinary questions about summaries are not."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compaction.client_prompts import (
    RECOGNIZERS,
    UNKNOWN_CLIENT,
    Shape,
    is_acknowledgement,
    last_answer_turn,
    last_user_turn,
    recognize,
)

CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "run ls"},
    {"role": "assistant", "content": "done"},
]

CLAUDE_CODE = (  # @anthropic-ai/claude-code 2.1.197, its compact prompt's opening
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Do NOT use Read, Bash, Grep, Glob, Edit, Write, or "
    "ANY other tool.\n- You already have all the context you need in the conversation above.\n\nYour task is to "
    "create a detailed summary of the conversation so far, paying close attention to the user's explicit requests "
    "and your previous actions."
)
CODEX = (  # @openai/codex 0.169.0, local compaction (docs/research/responses.md, 3.5)
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will resume "
    "the task."
)
PI_CONVERSATION = (  # @earendil-works/pi-coding-agent 0.74.2: serializeConversation, parts joined by a blank line
    '[User]: Turn 1: run `ls` and tell me its last line.\n\n[Assistant tool calls]: bash(command="ls")\n\n'
    "[Tool result]: a\nb\n\n[Assistant]: The last line is: b\n\n[User]: Turn 2: run `pwd`.\n\n"
    '[Assistant tool calls]: bash(command="pwd")\n\n[Tool result]: /tmp'
)
PI_PROMPTS = (  # core/compaction/compaction.js: SUMMARIZATION_PROMPT, UPDATE_SUMMARIZATION_PROMPT, turn prefix
    "The messages above are a conversation to summarize. Create a structured context checkpoint summary that "
    "another LLM will use to continue the work.\n\nUse this EXACT format:\n\n## Goal\n",
    "<previous-summary>\nearlier\n</previous-summary>\n\nThe messages above are NEW conversation messages to "
    "incorporate into the existing summary provided in <previous-summary> tags.\n\nUpdate the existing structured "
    "summary with new information.",
    "This is the PREFIX of a turn that was too large to keep. The SUFFIX (recent work) is retained.\n\nSummarize "
    "the prefix to provide context for the retained suffix:",
)
PI_SYSTEM = (
    "You are a context summarization assistant. Your task is to read a conversation between a user and an AI coding "
    "assistant, then produce a structured summary following the exact format specified."
)
OPENCODE_CONVERSATION = (  # opencode-ai 1.18.33: parts joined by a newline
    '[User]: Turn 1: run `ls`\n[Assistant tool call]: bash({"command":"ls"})\n[Tool result]: a\nb\n'
    "[Assistant]: The last line is: b\n[User]: Turn 2: run `pwd`\n[Assistant]: ok"
)
OPENCODE_PROMPTS = (  # SessionCompaction: a first summary, and one over a prior summary
    "Create a new anchored summary from the conversation history in the <conversation> tags above so another coding "
    "agent can continue the work.\n<template>\n## Objective\n",
    "Here is the summary of the conversation before the <conversation> above:\n<prior-summary>\nearlier\n"
    "</prior-summary>\nThe <prior-summary> summarizes everything that happened before the <conversation>. Construct "
    "a new summary that combines both.",
)


GEMINI_CLI_PROMPTS = (  # @google/gemini-cli 0.61.0, ChatCompressionService.compress: the snapshot, then its check
    "Generate a new <state_snapshot> based on the provided history.\n\nFirst, reason in your scratchpad. Then, "
    "generate the updated <state_snapshot>.",
    "A previous <state_snapshot> exists in the history. You MUST integrate all still-relevant information from that "
    "snapshot into the new one, updating it with the more recent events. Do not lose established constraints or "
    "critical knowledge.\n\nFirst, reason in your scratchpad. Then, generate the updated <state_snapshot>.",
    "Critically evaluate the <state_snapshot> you just generated. Did you omit any specific technical details, file "
    "paths, tool results, or user constraints mentioned in the history? If anything is missing or could be more "
    "precise, generate a FINAL, improved <state_snapshot>. Otherwise, repeat the exact same <state_snapshot> again.",
)


def pi_request(prompt: str) -> list[dict[str, Any]]:
    text = f"<conversation>\n{PI_CONVERSATION}\n</conversation>\n\n{prompt}"
    return [{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": [{"type": "text", "text": text}]}]


def opencode_request(prompt: str) -> list[dict[str, Any]]:
    text = f"Here is the conversation so far:\n<conversation>\n{OPENCODE_CONVERSATION}\n</conversation>\n{prompt}"
    return [{"role": "user", "content": text}]


def client_of(messages: list[dict[str, Any]], tools: bool = False) -> str | None:
    found = recognize(messages, tools)
    return None if found is None else found.recognizer.client


def test_every_recognizer_names_its_client_and_version() -> None:
    assert {recognizer.client for recognizer in RECOGNIZERS} == {"Claude Code", "Codex", "Pi", "OpenCode", "Gemini CLI"}
    assert all(recognizer.version and (recognizer.openings or recognizer.phrases) for recognizer in RECOGNIZERS)


def test_claude_codes_prompt_after_the_conversation() -> None:
    found = recognize([*CONVERSATION, {"role": "user", "content": CLAUDE_CODE}], tools=True)
    assert found is not None
    assert found.recognizer.client == "Claude Code"
    assert found.shape is Shape.APPENDED
    assert found.recognizer.tagged


def test_codexs_prompt_after_the_conversation() -> None:
    assert client_of([*CONVERSATION, {"role": "user", "content": CODEX}], tools=True) == "Codex"


@pytest.mark.parametrize("prompt", GEMINI_CLI_PROMPTS)
def test_gemini_clis_state_snapshot_and_its_check_after_the_conversation(prompt: str) -> None:
    """Sent without tools, under a system prompt of their own (`getCompressionPrompt`)."""
    snapshot = "You are a specialized system component responsible for distilling chat history into a structured XML"
    messages = [{"role": "system", "content": snapshot}, *CONVERSATION[1:], {"role": "user", "content": prompt}]
    found = recognize(messages, tools=False)
    assert found is not None
    assert found.recognizer.client == "Gemini CLI"
    assert found.shape is Shape.APPENDED
    assert not found.recognizer.tagged


def test_a_clients_acknowledgement_of_the_summary_it_keeps_is_known_by_its_words() -> None:
    assert is_acknowledgement({"role": "assistant", "content": "Got it. Thanks for the additional context!"})
    assert not is_acknowledgement({"role": "user", "content": "Got it. Thanks for the additional context!"})
    assert not is_acknowledgement({"role": "assistant", "content": "Got it."})


@pytest.mark.parametrize("prompt", PI_PROMPTS)
def test_pis_summary_requests(prompt: str) -> None:
    found = recognize(pi_request(prompt), tools=False)
    assert found is not None
    assert found.recognizer.client == "Pi"
    assert found.shape is Shape.SERIALIZED
    assert found.conversation.startswith("[User]: Turn 1")
    assert last_user_turn(found.conversation) == "Turn 2: run `pwd`."


@pytest.mark.parametrize("prompt", OPENCODE_PROMPTS)
def test_opencodes_summary_requests(prompt: str) -> None:
    found = recognize(opencode_request(prompt), tools=False)
    assert found is not None
    assert found.recognizer.client == "OpenCode"
    assert last_user_turn(found.conversation) == "Turn 2: run `pwd`"


def test_an_unknown_clients_serialized_summary_request_is_recognized_by_its_structure() -> None:
    text = f"<conversation>\n{PI_CONVERSATION}\n</conversation>\n\nWrite a summary of this conversation."
    found = recognize([{"role": "user", "content": text}], tools=False)
    assert found is not None
    assert found.recognizer is UNKNOWN_CLIENT


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Can you summarize the conversation we had yesterday about the budget?"}],
        [*CONVERSATION, {"role": "user", "content": "Please write a summary of the conversation so far."}],
        [{"role": "user", "content": "Summarize: <conversation>just one line</conversation>"}],
        [*CONVERSATION, {"role": "user", "content": f"What does this prompt do? {PI_PROMPTS[0]}"}],
    ],
)
def test_an_ordinary_question_about_summaries_is_not_a_compaction(messages: list[dict[str, Any]]) -> None:
    assert recognize(messages, tools=False) is None


def test_a_serialized_prompt_with_tools_or_several_user_turns_is_the_users_own() -> None:
    assert recognize(pi_request(PI_PROMPTS[0]), tools=True) is None
    assert recognize([*CONVERSATION[:2], *pi_request(PI_PROMPTS[0])[1:]], tools=False) is None


def test_the_last_answer_of_a_conversation_showing_no_user_turn_is_its_last_text_or_tool_result() -> None:
    cut = "row 1\nrow 2\n\n[... 5312 more characters truncated]"
    shown = f'[Assistant tool calls]: bash(command="seq 1 9")\n\n[Tool result]: {cut}'
    assert last_answer_turn(shown) == ("tool", "row 1\nrow 2")
    assert last_answer_turn("[Assistant]: done\n\n[Assistant tool calls]: bash()") == ("assistant", "done")
    assert last_answer_turn("") is None
