"""The text side of summaries: the messages they are sent as, the summarizer's prompt, the no-LLM fallback, and
tool-output reduction.

Everything here is pure so that it can be tested exhaustively and so that the fallback is deterministic: when
the summarizer model fails (or is not waited for), `extractive_summary` still keeps the request alive with the
lines most likely to matter later (identifiers, paths, numbers, key=value facts, decisions, errors, open tasks).
Facts stated in the conversation (`KEY=value`, `key = value`, `key: 42`) come first, as their exact strings on one
`facts:` line, so that many fit a small target; then whole sentences by what they are worth, earlier summaries'
lines first among equals. A later fallback that merges earlier summaries reads their facts back and keeps them
before anything new, so facts survive being merged again and again.
Long tool outputs are reduced to the tool, its key inputs and its outcome before any summarizer sees them,
because a 50k-token log is mostly noise and would not fit the summarizer's own context.

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

from proxy.tokens import content_text, count_message, count_text

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
MAX_SEGMENT_CHARS = 400
MAX_ARGUMENTS_CHARS = 300
"""Longer tool-call arguments (a whole file being written) are shown as their key inputs only."""
FALLBACK_SENTENCE_CHARS = 160
FACTS_LABEL = "facts"
"""Starts the fallback's line of facts, so that a later fallback merging this summary reads them back as facts."""
FACT_SEPARATOR = "; "
FACT_CONTEXT_SCORE = 1
"""A sentence whose facts are on the facts line still says what they are for: kept when there is room."""
FACT_SHARE = 0.75
"""New facts may fill this much of a fallback summary before its best sentences (errors, decisions, tasks) are
chosen; an earlier summary's facts are kept whatever room they take."""

INSTRUCTION = """\
You summarize an earlier part of a conversation between a user and an AI assistant (with tool calls) so \
that the assistant can continue the conversation from the summary alone.
Write a dense, chronological summary in at most about {target} tokens. Keep every fact, decision and its \
reason, identifier (function, class, variable and table names), file path, URL, command, number, setting, \
error message, and every open task or unanswered question. Prefer exact strings over paraphrase. Earlier \
summaries in the transcript are part of the history: merge them in order. Do not add a preamble, do not \
address the user, do not invent anything."""

_ERROR = re.compile(r"error|exception|failed|failure|traceback|fatal|panic", re.IGNORECASE)
_WARNING = re.compile(r"warning|denied|refused|timed? ?out|not found", re.IGNORECASE)
_EXIT = re.compile(r"exit(?:ed)?(?: with)?(?: code| status)?[ :=]*-?\d+|return ?code[ :=]*-?\d+", re.I)
_COUNT = re.compile(
    r"\b\d+ (?:passed|failed|errors?|warnings?|skipped|tests?|files?|lines?|matches|results?|rows?|items?)\b",
    re.IGNORECASE,
)
_PATH = re.compile(r"(?:[\w.~-]*/[\w.-]+)+|\b[\w-]+\.(?:py|js|ts|tsx|go|rs|java|c|h|cpp|md|json|ya?ml|toml|sql|sh)\b")
_IDENTIFIER = re.compile(
    r"\b(?:[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*|[A-Za-z0-9]+_[A-Za-z0-9_]+|[A-Za-z_]\w*\.[A-Za-z_][\w.]*|\w+\(\))"
)
_NUMBER = re.compile(r"\d")
_FACT = re.compile(r"\b[\w.-]+ ?(?:=|:) ?\S")
_DECISION = re.compile(r"\b(?:decided|decide|we will|we'll|agreed|chose|choose|use |switch to|instead)", re.I)
_TASK = re.compile(r"\b(?:TODO|FIXME|next|need to|needs to|should|must|remaining|open question)\b", re.I)
_REDUCTION_MARK = re.compile(r"^\[.*\) output reduced: \d+ lines\]$|^\.\.\. \(\d+ lines\)$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[])")
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-/?&%])[A-Za-z_][\w.-]*(?: ?=(?![=>]) ?|(?P<colon>: +))"
    r"(?P<value>\"[^\"\n;]*\"|'[^'\n;]*'|`[^`\n;]*`|[^\s,;\"'`]+)"
)
"""`KEY=value`, `key = value`, `key: value` as written in a sentence; a value ends at a space, comma or semicolon."""
_VALUE_END = ".,:!?)]}"
_NAMED_KEY = re.compile(r"[_\d.]|[a-z][A-Z]")
"""A key that is clearly a name (`retry_limit`, `apiTimeout`, `v2`): `key: value` is a fact whatever the value."""
_VALUE_LIKE = re.compile(r"\d|[_/]|[a-z][A-Z]")
"""A value that is clearly data (a number, a path, an identifier), which makes `Word: value` a fact too."""
_ROLES = frozenset(("summary", "user", "assistant", "system", "developer", "tool", "facts"))
_CLOSING = {")": "(", "]": "[", "}": "{"}
_LABEL = re.compile(r"^(?:(?:summary|user|assistant|system|developer|tool(?: [\w.-]+)?): )+")
"""Role labels the fallback puts before its lines; facts are read from what follows them."""

_SCORES: tuple[tuple[re.Pattern[str], int], ...] = (
    (_ERROR, 5),
    (_EXIT, 4),
    (_DECISION, 4),
    (_TASK, 4),
    (_FACT, 3),
    (_PATH, 3),
    (_IDENTIFIER, 2),
    (_NUMBER, 1),
)
"""What makes a line worth keeping in the fallback, by how costly it is to lose."""
SUMMARY_LABEL = "summary"
_TEXT = "text"
_TOOL = "tool"
SUMMARY_BONUS = 3
"""Lines of an earlier summary were already chosen as worth keeping once."""


def summary_message(content: str) -> dict[str, Any]:
    """The message a summary is sent as: always the same bytes for the same summary (invariant 6)."""
    return {"role": SUMMARY_ROLE, "content": SUMMARY_HEADER + "\n" + content}


def acknowledgement_message() -> dict[str, Any]:
    """The synthetic assistant turn that keeps user and assistant turns alternating around a summary."""
    return {"role": "assistant", "content": ACKNOWLEDGEMENT}


def target_tokens(
    original_tokens: int,
    ratio: float = DEFAULT_TARGET_RATIO,
    low: int = DEFAULT_SUMMARY_MIN,
    high: int = DEFAULT_SUMMARY_MAX,
) -> int:
    """How long a summary of `original_tokens` tokens (what the summarizer reads) should be."""
    return max(low, min(high, math.ceil(round(ratio * original_tokens, 6))))


def is_summary(message: Mapping[str, Any]) -> bool:
    return content_text(message.get("content")).startswith(SUMMARY_HEADER)


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
    lines = [_clip(line, MAX_LINE_CHARS) for line in output.splitlines()]
    header = f"[{name or 'tool'}({key_inputs(arguments)}) output reduced: {len(lines)} lines]"
    chosen: set[int] = set()
    text = _truncate(header, limit_tokens)
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
        return _clip(arguments, KEY_INPUT_MAX_CHARS)
    if not isinstance(parsed, dict):
        return _clip(json.dumps(parsed), KEY_INPUT_MAX_CHARS)
    pairs = [
        f"{key}={_clip(str(value), KEY_INPUT_MAX_CHARS)}"
        for key, value in parsed.items()
        if key in KEY_INPUT_FIELDS and isinstance(value, str | int | float) and not isinstance(value, bool)
    ]
    return ", ".join(pairs)


def extractive_summary(messages: Sequence[Mapping[str, Any]], target: int) -> str:
    """The deterministic fallback summary within `target` tokens: the facts stated in `messages` first, on one
    `facts:` line (an earlier summary's before new ones), then the best-scoring sentences in chronological order.
    New facts take at most `FACT_SHARE` of the target before the sentences have their turn, then what is left;
    a chosen sentence that shows a fact takes it off the facts line."""
    target = max(1, target)
    facts, sentences = _candidates(messages)
    chosen = _Choice(target)
    chosen.add_facts(facts, FACT_SHARE * target)
    chosen.add_sentences(sentences)
    chosen.add_facts(facts, target)
    text = chosen.trimmed()
    if text:
        return text
    fallback = _truncate(_first_sentences(messages), target)
    return fallback or _truncate(f"{len(messages)} earlier messages", target)


def fallback_summary(messages: Sequence[Mapping[str, Any]], target: int, replaced: int, encoding: str) -> str:
    """The extractive summary within `target` tokens, cut further until its summary message costs fewer than the
    `replaced` tokens of what it stands for: a summary that does not shrink its range is of no use.

    When even the shortest summary cannot shrink the range (`replaced` below a bare summary message, which the
    builder never asks for), the shortest is returned and the builder keeps showing the originals.
    """
    limit = max(1, min(target, replaced - count_message(summary_message(""), encoding) - 1))
    while True:
        content = extractive_summary(messages, limit)
        excess = count_message(summary_message(content), encoding) - replaced + 1
        if excess <= 0 or limit == 1:
            return content
        limit = max(1, limit - excess)


@dataclass(frozen=True)
class _Fact:
    position: int
    text: str
    """As it was written: `DEPLOY_REGION=eu-west-3`, `retry_limit = 7`."""
    score: int


@dataclass(frozen=True)
class _Segment:
    position: int
    text: str
    """The sentence with its label: `user: …`."""
    score: int
    facts: tuple[str, ...]
    """The facts it shows."""


class _Choice:
    """What a fallback summary keeps, and its estimated cost: each piece counted alone, plus its separator."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.facts: list[_Fact] = []
        self.sentences: list[_Segment] = []
        self.listed: dict[str, int] = {}
        """The kept facts no kept sentence shows (the facts line), with their costs."""
        self.used = 0

    def add_facts(self, facts: Sequence[_Fact], limit: float) -> None:
        """Facts in their order while they fit: new ones within `limit`, an earlier summary's within the target."""
        taken = {fact.text for fact in self.facts}.union(*(sentence.facts for sentence in self.sentences))
        for fact in facts:
            cost = count_text(fact.text) + 1 + (0 if self.listed else count_text(FACTS_LABEL + ":") + 1)
            room = self.target if fact.score >= SUMMARY_BONUS else limit
            if fact.text not in taken and self.used + cost <= room:
                self.facts.append(fact)
                self.listed[fact.text] = cost
                self.used += cost

    def add_sentences(self, sentences: Sequence[_Segment]) -> None:
        """The best sentences that fit; one that shows a listed fact costs that much less."""
        for sentence in sorted(sentences, key=lambda s: (-s.score, s.position)):
            shown = [fact for fact in sentence.facts if fact in self.listed]
            cost = count_text(sentence.text) + 1 - sum(self.listed[fact] for fact in shown)
            if self.used + cost <= self.target:
                self.sentences.append(sentence)
                for fact in shown:
                    del self.listed[fact]
                self.used += cost

    def trimmed(self) -> str:
        """The summary, its least valuable pieces dropped while the estimate fell short of the exact count."""
        text = self.text()
        while text and count_text(text) > self.target:
            if self.sentences:
                self.sentences.remove(min(self.sentences, key=lambda s: (s.score, -s.position)))
            else:
                self.facts.pop()
            text = self.text()
        return text

    def text(self) -> str:
        shown = {fact for sentence in self.sentences for fact in sentence.facts}
        listed = [fact.text for fact in sorted(self.facts, key=lambda f: f.position) if fact.text not in shown]
        lines = [f"{FACTS_LABEL}: " + FACT_SEPARATOR.join(listed)] if listed else []
        return "\n".join(lines + [s.text for s in sorted(self.sentences, key=lambda s: s.position)])


def _candidates(messages: Sequence[Mapping[str, Any]]) -> tuple[list[_Fact], list[_Segment]]:
    """The facts of `messages` (first seen first, an earlier summary's before any new one) and their sentences
    (each once), scored by what the sentence says besides its facts."""
    facts: dict[str, _Fact] = {}
    sentences: dict[str, _Segment] = {}
    position = 0
    for label, text, kind in _labelled_texts(messages):
        bonus = SUMMARY_BONUS if kind == SUMMARY_LABEL else 0
        for line in text.splitlines():
            listed = _fact_line(line) if kind == SUMMARY_LABEL else None
            if listed is not None:
                for fact in listed:
                    facts.setdefault(fact, _Fact(position, fact, bonus))
                    position += 1
                continue
            prefix, line = _label_of(line, label, kind)
            for sentence in _SENTENCE_END.split(line.strip()):
                sentence = sentence.strip()
                if not sentence or not any(ch.isalnum() for ch in sentence) or sentence in sentences:
                    continue
                found = _facts_in(sentence) if kind in (SUMMARY_LABEL, _TEXT) else []
                written = [sentence[start:end] for start, end in found]
                for fact in written:
                    facts.setdefault(fact, _Fact(position, fact, bonus))
                score = max(_score(_remove(sentence, found)), FACT_CONTEXT_SCORE if found else 0) + bonus
                shown = _clip(sentence, MAX_SEGMENT_CHARS)
                if score > 0:
                    shows = tuple(fact for fact in written if fact in shown)
                    sentences[sentence] = _Segment(position, f"{prefix}: {shown}", score, shows)
                position += 1
    return sorted(facts.values(), key=lambda f: (-f.score, f.position)), list(sentences.values())


def _label_of(line: str, label: str, kind: str) -> tuple[str, str]:
    """(label, text) of one line: an earlier summary's line keeps the label it has (`user: …`, not `summary: user:
    …`, however often it is merged again)."""
    if kind == SUMMARY_LABEL:
        labelled = _LABEL.match(line)
        if labelled:
            return labelled.group()[:-2], line[labelled.end() :]
    return label, line


def _fact_line(line: str) -> list[str] | None:
    """The facts of a `facts:` line an earlier fallback wrote, or None if `line` is not one."""
    if not line.startswith(FACTS_LABEL + ": "):
        return None
    listed = line[len(FACTS_LABEL) + 2 :].split(FACT_SEPARATOR)
    if all(_facts_in(fact) == [(0, len(fact))] for fact in listed):
        return listed
    return None


def _facts_in(sentence: str) -> list[tuple[int, int]]:
    """Where facts are written in a sentence: `KEY=value`, `key = value`, and `key: value` where the key is a name
    or the value is data (`Note: the` is prose). Trailing punctuation is the sentence's, not the value's."""
    found = []
    for match in _ASSIGNMENT.finditer(sentence):
        value, end = match.group("value"), match.end()
        if value[0] not in "\"'`":
            while value and (value[-1] in _VALUE_END or (value[-1] in _CLOSING and _unbalanced(value))):
                value, end = value[:-1], end - 1
            if not value or "(" in value or value[0] in "[{<":
                continue
        key = sentence[match.start() : match.start("value")].rstrip(" =:")
        if match.group("colon") and (
            key.lower() in _ROLES or not (_NAMED_KEY.search(key) or _VALUE_LIKE.search(value))
        ):
            continue
        found.append((match.start(), end))
    return found


def _unbalanced(value: str) -> bool:
    closing = value[-1]
    return value.count(closing) > value.count(_CLOSING[closing])


def _remove(sentence: str, found: Sequence[tuple[int, int]]) -> str:
    for start, end in reversed(found):
        sentence = sentence[:start] + " " + sentence[end:]
    return sentence


def _score(text: str) -> int:
    return sum(weight for pattern, weight in _SCORES if pattern.search(text))


def _first_sentences(messages: Sequence[Mapping[str, Any]]) -> str:
    firsts = []
    for role, text, _ in _labelled_texts(messages):
        stripped = text.strip()
        if stripped:
            first = _SENTENCE_END.split(stripped.splitlines()[0])[0]
            firsts.append(f"{role}: {_clip(first, FALLBACK_SENTENCE_CHARS)}")
    return "\n".join(firsts)


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


def _labelled_texts(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str, str]]:
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
                yield seen.role, seen.text, _TEXT
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
    signals = [i for i, line in enumerate(lines) if _ERROR.search(line) or _EXIT.search(line)]
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


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _truncate(text: str, limit_tokens: int) -> str:
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
