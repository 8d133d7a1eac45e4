"""The text side of summaries: the messages they are sent as, the summarizer's prompt, tool-output reduction, and
the labelled reading of a transcript that the no-LLM fallback (`extractive`) shares with the prompt.

Everything here is pure so that it can be tested exhaustively. Long tool outputs are reduced to the tool, its key
inputs and its outcome before any summarizer sees them, because a 50k-token log is mostly noise and would not fit
the summarizer's own context.

A summary is sent as a user turn, because strict chat templates (local models, several providers) accept system
messages only at the start and require user and assistant turns to alternate; where a summary would put two user
turns in a row, the builder places an `acknowledgement_message` between them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.vocabulary import ORIGIN, Origin, origin
from proxy.tokens import content_text, count_text

SUMMARY_HEADER = "[Earlier conversation summary]"
"""Starts every summary message, so both the model and a re-summarization can tell summaries from turns."""
SUMMARY_ROLE = "user"
"""The role a summary is sent in: a user turn is valid wherever a strict chat template expects one."""
ACKNOWLEDGEMENT = "Understood."
"""The assistant turn placed between a summary and a user turn next to it, so that the turns keep alternating."""

DEFAULT_TARGET_RATIO = 0.15
DEFAULT_SUMMARY_MIN = 64
"""Below this a summary cannot name what happened, however short the original."""
DEFAULT_SUMMARY_MAX = 2_048
"""Above this summaries stop being cheap; hierarchical summarization takes over."""

TOOL_OUTPUT_LIMIT = 400
"""Tokens a single tool result may take in the summarizer's transcript before it is reduced."""
KEY_INPUT_FIELDS = (
    "path", "file", "file_path", "filename", "filepath", "command", "cmd", "query", "url", "id", "name",
    "pattern", "directory", "dir",
)  # fmt: skip
"""Tool-call arguments that say what a call was about; everything else is detail the outcome carries."""
KEY_INPUT_MAX_CHARS = 120
HEAD_LINES = 3
TAIL_LINES = 5
MAX_LINE_CHARS = 240
"""Long lines (minified JSON, base64) are cut: their first characters say what they are."""
MAX_MISSES = 8
"""Lines tried in a row that no longer fit before a reduction stops: the limit is then all but used."""
MAX_ARGUMENTS_CHARS = 300
"""Longer tool-call arguments (a whole file being written) are shown as their key inputs only."""

INSTRUCTION = """\
You summarize an earlier part of a conversation (between people, or between a user and an AI assistant with \
tool calls) so that the assistant can continue the conversation from the summary alone.
Write at most about {target} tokens, in these sections, leaving out an empty one:
People: who is who (names, relations) and who speaks.
Facts (dated): one line per fact, under the date it was said (the transcript's date stamps) and with who said \
it, e.g. "[8 May, 2023]" then "Caroline: adopted a beagle named Biscuit"; a fact that changed later only with \
its newest value.
Decisions: each decision and its reason.
Open threads: open tasks, plans and unanswered questions.
A coding or agent session is summarized chronologically instead: each step's file paths, commands, \
identifiers (function, class, variable and table names), settings and error messages, each decision and its \
reason, and every open task or unanswered question. Prefer exact strings (numbers, URLs, key=value settings) \
over paraphrase. Earlier summaries in the transcript are part of the history: merge them in order, keeping \
their sections and dates. Do not add a preamble, do not address the user, do not invent anything."""
"""The summarizer model's instruction: the same sections as the no-model summary of a conversation
(`sections`), the same chronological form for an agent's session."""

ERROR = re.compile(r"error|exception|failed|failure|traceback|fatal|panic", re.IGNORECASE)
_WARNING = re.compile(r"warning|denied|refused|timed? ?out|not found", re.IGNORECASE)
EXIT = re.compile(r"exit(?:ed)?(?: with)?(?: code| status)?[ :=]*-?\d+|return ?code[ :=]*-?\d+", re.I)
_COUNT = re.compile(
    r"\b\d+ (?:passed|failed|errors?|warnings?|skipped|tests?|files?|lines?|matches|results?|rows?|items?)\b",
    re.IGNORECASE,
)
_REDUCTION_MARK = re.compile(r"^\[.*\) output reduced: \d+ lines\]$|^\.\.\. \(\d+ lines\)$")

SUMMARY_LABEL = "summary"
"""The label and kind `labelled_texts` gives an earlier summary's content."""
TEXT = "text"
"""The kind `labelled_texts` gives a message's own text, where facts are stated."""
_TOOL = "tool"


def summary_message(content: str) -> dict[str, Any]:
    """The message a summary is sent as: always the same bytes for the same summary (invariant 6)."""
    return {"role": SUMMARY_ROLE, "content": SUMMARY_HEADER + "\n" + content, ORIGIN: Origin.SUMMARY}


def acknowledgement_message() -> dict[str, Any]:
    """The synthetic assistant turn that keeps user and assistant turns alternating around a summary."""
    return {"role": "assistant", "content": ACKNOWLEDGEMENT, ORIGIN: Origin.ACKNOWLEDGEMENT}


def target_tokens(
    original_tokens: int,
    ratio: float = DEFAULT_TARGET_RATIO,
    low: int = DEFAULT_SUMMARY_MIN,
    high: int = DEFAULT_SUMMARY_MAX,
) -> int:
    """How long a summary of `original_tokens` tokens (what the summarizer reads) should be."""
    return max(low, min(high, math.ceil(round(ratio * original_tokens, 6))))


def is_summary(message: Mapping[str, Any]) -> bool:
    return origin(message) == Origin.SUMMARY


def summarizer_messages(messages: Sequence[Mapping[str, Any]], target: int) -> list[dict[str, Any]]:
    """The summarizer's prompt: the instruction, then the transcript of `messages` as one user message."""
    transcript = "\n\n".join(_render(messages))
    return [
        {"role": "system", "content": INSTRUCTION.format(target=target)},
        {"role": "user", "content": f"Transcript to summarize:\n\n{transcript}\n\nWrite the summary now."},
    ]


def reduce_tool_output(name: str | None, arguments: str | None, output: str, limit_tokens: int) -> str:
    """A tool result over `limit_tokens` cut to the tool, its key inputs and its outcome, within the limit."""
    if count_text(output) <= limit_tokens:
        return output
    lines = [clip(line, MAX_LINE_CHARS) for line in output.splitlines()]
    header = f"[{name or 'tool'}({key_inputs(arguments)}) output reduced: {len(lines)} lines]"
    chosen: set[int] = set()
    text = truncate(header, limit_tokens)
    misses = 0
    for index in _outcome_order(lines):
        candidate = _assemble(header, lines, chosen | {index})
        if count_text(candidate) > limit_tokens:
            misses += 1
            if misses >= MAX_MISSES:
                break
            continue
        chosen.add(index)
        text = candidate
    return text


def key_inputs(arguments: str | None) -> str:
    """`path=src/app.py, command=pytest` from a tool call's JSON arguments (short scalar fields only)."""
    if not arguments:
        return ""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return clip(arguments, KEY_INPUT_MAX_CHARS)
    if not isinstance(parsed, dict):
        return clip(json.dumps(parsed), KEY_INPUT_MAX_CHARS)
    pairs = [
        f"{key}={clip(str(value), KEY_INPUT_MAX_CHARS)}"
        for key, value in parsed.items()
        if key in KEY_INPUT_FIELDS and isinstance(value, str | int | float) and not isinstance(value, bool)
    ]
    return ", ".join(pairs)


@dataclass(frozen=True)
class _Seen:
    """One message as both readers of a transcript see it."""

    message: Mapping[str, Any]
    role: str
    text: str
    tool: str | None
    """On a tool result: the name of the call it answers."""
    reduced: str
    """On a tool result: its output reduced to what matters (`reduce_tool_output`)."""
    summary: str | None
    """On an earlier summary: its content without the header."""


def _seen(messages: Sequence[Mapping[str, Any]]) -> Iterator[_Seen]:
    # A result answers the nearest call before it with its id: some local servers reuse ids on every turn.
    calls: dict[str, tuple[str, str | None]] = {}
    for message in messages:
        role = str(message.get("role") or "message")
        text = content_text(message.get("content"))
        tool, reduced, summary = None, "", None
        if role == "tool":
            tool, arguments = calls.get(str(message.get("tool_call_id")), (None, None))
            reduced = reduce_tool_output(tool, arguments, text, TOOL_OUTPUT_LIMIT)
        elif text.startswith(SUMMARY_HEADER):
            summary = text[len(SUMMARY_HEADER) :].strip()
        calls.update(_calls_with_ids(message))
        yield _Seen(message, role, text, tool, reduced, summary)


def labelled_texts(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str, str]]:
    """(label, text, kind) per message: summaries unwrapped, tool calls named, tool outputs reduced. The kind says
    where facts are read: a message's own text and earlier summaries, not tool outputs (evidence, ranked as lines)
    or the call lines written here (already as short as they get)."""
    for seen in _seen(messages):
        if seen.role == "tool":
            # The call itself was already yielded with its key inputs: keep only the outcome lines.
            outcome = [line for line in seen.reduced.splitlines() if not _REDUCTION_MARK.match(line)]
            yield f"tool {seen.tool or ''}".rstrip(), "\n".join(outcome), _TOOL
        elif seen.summary is not None:
            yield SUMMARY_LABEL, seen.summary, SUMMARY_LABEL
        else:
            if seen.text.strip():
                yield seen.role, seen.text, TEXT
            for name, arguments in _tool_calls(seen.message):
                yield seen.role, f"called {name}({key_inputs(arguments)})", _TOOL


def _render(messages: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    for seen in _seen(messages):
        if seen.role == "tool":
            yield f"TOOL RESULT ({seen.tool or 'unknown tool'}):\n{seen.reduced}"
        elif seen.summary is not None:
            yield f"Earlier summary: {seen.summary}"
        else:
            parts = [seen.text] if seen.text.strip() else []
            parts += [f"-> {name}({_shown_arguments(arguments)})" for name, arguments in _tool_calls(seen.message)]
            yield f"{seen.role.upper()}: " + "\n".join(parts)


def _shown_arguments(arguments: str | None) -> str:
    if arguments is None or len(arguments) <= MAX_ARGUMENTS_CHARS:
        return arguments or ""
    shown = key_inputs(arguments)
    return f"{shown}, … {len(arguments)} characters" if shown else f"… {len(arguments)} characters"


def _tool_calls(message: Mapping[str, Any]) -> Iterator[tuple[str, str | None]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return
    for call in calls:
        if isinstance(call, Mapping):
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            arguments = function.get("arguments")
            yield str(function.get("name") or "tool"), arguments if isinstance(arguments, str) else None


def _calls_with_ids(message: Mapping[str, Any]) -> Iterator[tuple[str, tuple[str, str | None]]]:
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call, named in zip((c for c in calls if isinstance(c, Mapping)), _tool_calls(message), strict=True):
            yield str(call.get("id")), named


def _outcome_order(lines: Sequence[str]) -> list[int]:
    """Line indices by what they say about the outcome: errors, exit codes and counts, the end, the start."""
    signals = [i for i, line in enumerate(lines) if ERROR.search(line) or EXIT.search(line)]
    counts = [i for i, line in enumerate(lines) if _COUNT.search(line) or _WARNING.search(line)]
    tail = list(range(len(lines) - 1, max(-1, len(lines) - 1 - TAIL_LINES), -1))
    head = list(range(min(HEAD_LINES, len(lines))))
    order: list[int] = []
    for index in [*signals[:1], *tail[:1], *head[:1], *signals[1:], *counts, *tail[1:], *head[1:]]:
        if index not in order and lines[index].strip():
            order.append(index)
    return order


def _assemble(header: str, lines: Sequence[str], chosen: set[int]) -> str:
    out = [header]
    previous = -1
    for index in sorted(chosen):
        if index != previous + 1:
            out.append(f"... ({index - previous - 1} lines)")
        out.append(lines[index])
        previous = index
    if chosen and previous != len(lines) - 1:
        out.append(f"... ({len(lines) - 1 - previous} lines)")
    return "\n".join(out)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def truncate(text: str, limit_tokens: int) -> str:
    """The longest prefix of `text` within `limit_tokens` (binary search: tokens are not characters)."""
    if count_text(text) <= limit_tokens:
        return text
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count_text(text[:middle]) <= limit_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]
