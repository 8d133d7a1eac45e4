"""Which requests are a client's own compaction: one registry of the prompts agent clients send to have their
conversation summarized, each citing the client and the version whose prompt it matches.

Two shapes reach the proxy. `APPENDED`: the conversation itself, then a last user message asking for a summary
(Claude Code, Codex's local compaction, Gemini CLI's `<state_snapshot>` and its check of it, which sends the
snapshot back as the model's turn); the proxy stores the conversation and answers. `SERIALIZED`: a request of
its own whose one user message holds the conversation written out as text (`[User]: ...`, `[Assistant]: ...`) in
`<conversation>` tags, then the prompt (Pi, OpenCode); the proxy answers for the stored session that text
comes from. A serialized request from a client not listed here is recognized by its structure alone: no tools,
one user message with a `<conversation>` block of role-marked turns that asks for a summary — and only answered
when the last user turn written in it is one the proxy holds
(`proxy.request.client_compaction.summarized_session`), so a user's ordinary question is never taken for one.
The Responses API's own compaction (`compaction_trigger`, `/v1/responses/compact`) is a request field, read by its
door (`proxy.doors.responses.compaction`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from proxy.canonical.types import Message
from proxy.tokens import content_text


class Shape(Enum):
    APPENDED = "appended"
    """The conversation, then the prompt as the last user message."""
    SERIALIZED = "serialized"
    """One user message: the conversation as text, then the prompt."""


@dataclass(frozen=True)
class Recognizer:
    client: str
    version: str
    """The client version whose prompt the words were read from (its package, as published)."""
    shape: Shape
    openings: tuple[str, ...] = ()
    """The prompt message starts with one of these."""
    phrases: tuple[str, ...] = ()
    """Or holds one of these."""
    tagged: bool = False
    """The client reads the summary from an `<analysis>` block and a `<summary>` block."""
    acknowledgement: str = ""
    """What the client writes itself as the model's reply to the summary it keeps: it goes with the summary when
    the stored conversation takes their place (`proxy.request.continuations`)."""

    def matches(self, text: str) -> bool:
        return text.lstrip().startswith(self.openings) or any(phrase in text for phrase in self.phrases)


RECOGNIZERS = (
    Recognizer(
        "Claude Code",
        "@anthropic-ai/claude-code 2.1.197",
        Shape.APPENDED,
        openings=("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",),  # /compact, auto-compact, "up_to"
        phrases=(
            "Your task is to create a detailed summary of the conversation so far",
            "Your task is to create a detailed summary of the RECENT portion of the conversation",
        ),
        tagged=True,
    ),
    Recognizer(
        "Codex",
        "@openai/codex 0.169.0 (local compaction, custom provider)",
        Shape.APPENDED,
        openings=("You are performing a CONTEXT CHECKPOINT COMPACTION.",),
    ),
    Recognizer(
        "Gemini CLI",
        "@google/gemini-cli 0.61.0 (ChatCompressionService: the snapshot, then a second call checking it)",
        Shape.APPENDED,
        openings=("Critically evaluate the <state_snapshot> you just generated.",),
        phrases=("First, reason in your scratchpad. Then, generate the updated <state_snapshot>.",),
        acknowledgement="Got it. Thanks for the additional context!",
    ),
    Recognizer(
        "Pi",
        "@earendil-works/pi-coding-agent 0.74.2 (core/compaction/compaction.js)",
        Shape.SERIALIZED,
        phrases=(
            "The messages above are a conversation to summarize. Create a structured context checkpoint summary",
            "The messages above are NEW conversation messages to incorporate into the existing summary provided in "
            "<previous-summary> tags.",
            "This is the PREFIX of a turn that was too large to keep. The SUFFIX (recent work) is retained.",
        ),
    ),
    Recognizer(
        "OpenCode",
        "opencode-ai 1.18.33 (SessionCompaction)",
        Shape.SERIALIZED,
        phrases=(
            "Create a new anchored summary from the conversation history in the <conversation> tags above",
            "The <prior-summary> summarizes everything that happened before the <conversation>.",
        ),
    ),
)

UNKNOWN_CLIENT = Recognizer("an unknown client", "-", Shape.SERIALIZED)
"""What a serialized compaction request matched by its structure alone is recognized as."""

_CONVERSATION = re.compile(r"<conversation>\s*(.*?)\s*</conversation>", re.DOTALL)
_TURN_MARK = re.compile(
    r"^\[(User|Assistant[a-z ]*|Tool [a-z]+|System update|Synthetic context|Shell)\]: ", re.MULTILINE
)
MIN_SERIALIZED_TURNS = 2
"""A structural match needs at least this many role-marked turns in the `<conversation>` block."""
_ASKS_SUMMARY = re.compile(r"\bsummar(y|ize|ise)\b", re.IGNORECASE)


@dataclass(frozen=True)
class ClientCompaction:
    recognizer: Recognizer
    conversation: str = ""
    """A serialized request's conversation text (inside its `<conversation>` tags)."""

    @property
    def shape(self) -> Shape:
        return self.recognizer.shape


def recognize(messages: Sequence[Message], tools: bool) -> ClientCompaction | None:
    """The client compaction `messages` ask for, if any; `tools`: the request offers tools (a serialized
    request never does: it is a summary call of its own)."""
    if not messages or messages[-1].get("role") != "user":
        return None
    text = content_text(messages[-1].get("content"), "\n")
    for recognizer in RECOGNIZERS:
        if not recognizer.matches(text):
            continue
        if recognizer.shape is Shape.APPENDED:
            return ClientCompaction(recognizer)
        serialized = _serialized(text)
        if serialized is not None and not tools and _one_user_message(messages):
            return ClientCompaction(recognizer, serialized)
    if tools or not _one_user_message(messages) or not _ASKS_SUMMARY.search(text):
        return None
    serialized = _serialized(text)
    if serialized is None or len(_TURN_MARK.findall(serialized)) < MIN_SERIALIZED_TURNS:
        return None
    return ClientCompaction(UNKNOWN_CLIENT, serialized)


def shown_turns(conversation: str) -> list[tuple[str, str]]:
    """The turns written in a serialized conversation: each one's mark (`User`, `Assistant`, `Tool result`, ...)
    and its text (up to the next turn mark)."""
    marks = list(_TURN_MARK.finditer(conversation))
    ends = [mark.start() for mark in marks[1:]] + [len(conversation)] if marks else []
    return [(mark.group(1), conversation[mark.end() : end].strip()) for mark, end in zip(marks, ends, strict=True)]


def is_acknowledgement(message: Message) -> bool:
    """Whether `message` is a listed client's own reply to the summary it keeps (`Recognizer.acknowledgement`)."""
    if message.get("role") != "assistant" or message.get("tool_calls"):
        return False
    text = content_text(message.get("content")).strip()
    return any(text == recognizer.acknowledgement for recognizer in RECOGNIZERS if recognizer.acknowledgement)


def last_user_turn(conversation: str) -> str | None:
    """The text of the last `[User]: ` turn written in a serialized conversation (up to the next turn mark)."""
    return next((text for mark, text in reversed(shown_turns(conversation)) if mark == "User"), None)


_TRUNCATED = re.compile(r"\n*\[\.\.\. \d+ more characters truncated\]$")
"""Pi's mark of a tool result cut for its summary request (`truncateForSummary`, 0.74.2)."""


def last_answer_turn(conversation: str) -> tuple[str, str] | None:
    """For a serialized conversation that shows no user turn: its last assistant text (`assistant`, the text) or
    tool result (`tool`, the text as shown, which may be the start of the result), the turn a stored session
    must hold for the request to be about it."""
    for mark, text in reversed(shown_turns(conversation)):
        if not text:
            continue
        if mark == "Assistant":
            return "assistant", text
        if mark.startswith("Tool"):
            return "tool", _TRUNCATED.sub("", text)
    return None


def _one_user_message(messages: Sequence[Message]) -> bool:
    """Whether the last message is the only user message: read from the start and stopped at a second one, since
    a long session's request (asked this every time) has one early."""
    users = 0
    for message in messages:
        if message.get("role") == "user":
            users += 1
            if users > 1:
                return False
    return users == 1


def _serialized(text: str) -> str | None:
    found = _CONVERSATION.search(text)
    return None if found is None else found.group(1)
