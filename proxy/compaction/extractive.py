"""The deterministic extractive summary: the no-LLM fallback that keeps a request alive when the summarizer model
fails (or is not waited for), and keeps a conversation's facts through later merges.

It keeps the lines most likely to matter later (identifiers, paths, numbers, key=value facts, decisions, errors,
open tasks; in what people wrote, names, numbers, dates and new content words). Facts stated in the conversation
(`KEY=value`, `key = value`, `key: 42`) come first, as their exact strings on one `facts:` line, so that many fit a
small target (a later value of the same key replaces the earlier one); then whole sentences by what they are worth,
earlier summaries' lines first among equals, none twice. A conversation's summary is structured (`sections`:
people, dated facts, decisions, open threads, each line with its date and speaker); an agent's session (tool calls
and outputs) stays in the order things happened. A later fallback that merges earlier summaries reads their facts,
sections and dates back, so they survive being merged again and again. Pure and deterministic: the same messages
always give the same summary.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.compaction.facts import FACT_SEPARATOR, FACTS_LABEL, Fact, add_fact, fact_line, facts_in, remove
from proxy.compaction.prose import (
    content_words,
    date_line,
    date_stamp,
    information,
    short_date,
    speaker,
    specific,
    tells_of_others,
    terms,
)
from proxy.compaction.sections import (
    CHRONOLOGICAL,
    DECISIONS,
    OPEN,
    ORDER,
    header,
    latest,
    read_header,
    section_of,
)
from proxy.compaction.summary_text import (
    ERROR,
    EXIT,
    SUMMARY_LABEL,
    TEXT,
    clip,
    labelled_texts,
    summary_message,
    truncate,
)
from proxy.tokens import count_message, count_text

MAX_SEGMENT_CHARS = 400
FALLBACK_SENTENCE_CHARS = 160
FACT_CONTEXT_SCORE = 1
"""A sentence whose facts are on the facts line still says what they are for: kept when there is room."""
FACT_SHARE = 0.75
"""New facts may fill this much of a fallback summary before its best sentences (errors, decisions, tasks) are
chosen; an earlier summary's facts are kept whatever room they take."""

_PATH = re.compile(r"(?:[\w.~-]*/[\w.-]+)+|\b[\w-]+\.(?:py|js|ts|tsx|go|rs|java|c|h|cpp|md|json|ya?ml|toml|sql|sh)\b")
_IDENTIFIER = re.compile(
    r"\b(?:[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*|[A-Za-z0-9]+_[A-Za-z0-9_]+|[A-Za-z_]\w*\.[A-Za-z_][\w.]*|\w+\(\))"
)
_NUMBER = re.compile(r"\d")
_FACT = re.compile(r"\b[\w.-]+ ?(?:=|:) ?\S")
_DECISION = re.compile(r"\b(?:decided|decide|we will|we'll|agreed|chose|choose|use |switch to|instead)", re.I)
_TASK = re.compile(r"\b(?:TODO|FIXME|next|need to|needs to|should|must|remaining|open question)\b", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[])")
_LABEL = re.compile(r"^(?:(?:summary|user|assistant|system|developer|tool(?: [\w.-]+)?): )+")
"""Role labels the fallback puts before its lines; facts are read from what follows them."""

_SCORES: tuple[tuple[re.Pattern[str], int], ...] = (
    (ERROR, 5),
    (EXIT, 4),
    (_DECISION, 4),
    (_TASK, 4),
    (_FACT, 3),
    (_PATH, 3),
    (_IDENTIFIER, 2),
    (_NUMBER, 1),
)
"""What makes a line worth keeping in the fallback, by how costly it is to lose."""
_WORDED = (_DECISION, _TASK)
"""Signals written in ordinary words ("should", "next", "use"): in what people wrote, they count only in a
sentence that tells something (`prose.information`), or every "I really need to do that too" would be kept."""
PLAIN_SHARE = 0.5
"""Plain sentences (small talk, or what tells something without a name, number or date) fill at most this share
of a summary: a summary filled to its target with them costs every later merge its room for facts."""
SUMMARY_BONUS = 3
"""Lines of an earlier summary were already chosen as worth keeping once."""
SECTION_SCORE = 1
"""A conversation's decision or open thread (`sections`) is worth this much more than a fact told alike."""
REPEAT_SHARE = 0.8
"""A sentence of a conversation whose terms are this share of a kept sentence's (or the reverse) repeats it."""


def extractive_summary(messages: Sequence[Mapping[str, Any]], target: int, date: str | None = None) -> str:
    """The deterministic fallback summary within `target` tokens: the facts stated in `messages` first, on one
    `facts:` line (an earlier summary's before new ones), then the best-scoring sentences in chronological order.
    New facts take at most `FACT_SHARE` of the target before the sentences have their turn, then what is left;
    a chosen sentence that shows a fact takes it off the facts line. `date`: the date in force before the first
    message (its stamp was in an earlier range)."""
    target = max(1, target)
    facts, sentences, speakers = _candidates(messages, date)
    chosen = _Choice(target, structured=speakers is not None)
    chosen.add_facts(facts, FACT_SHARE * target)
    chosen.add_sentences(sentences)
    chosen.add_facts(facts, target)
    text = chosen.trimmed()
    if text:
        return text
    fallback = truncate(_first_sentences(messages), target)
    return fallback or truncate(f"{len(messages)} earlier messages", target)


def fallback_summary(
    messages: Sequence[Mapping[str, Any]], target: int, replaced: int, encoding: str, date: str | None = None
) -> str:
    """The extractive summary within `target` tokens, cut further until its summary message costs fewer than the
    `replaced` tokens of what it stands for: a summary that does not shrink its range is of no use.

    When even the shortest summary cannot shrink the range (`replaced` below a bare summary message, which the
    builder never asks for), the shortest is returned and the builder keeps showing the originals.
    """
    limit = max(1, min(target, replaced - count_message(summary_message(""), encoding) - 1))
    while True:
        content = extractive_summary(messages, limit, date)
        excess = count_message(summary_message(content), encoding) - replaced + 1
        if excess <= 0 or limit == 1:
            return content
        limit = max(1, limit - excess)


@dataclass(frozen=True)
class _Segment:
    position: int
    text: str
    """The sentence with its label (and its speaker, in a transcript): `user: …`, `assistant: Caroline: …`."""
    score: float
    facts: tuple[str, ...]
    """The facts it shows."""
    date: str | None = None
    """The date of the message it is from (its own stamp or the last one before it), shown above it."""
    plain: bool = False
    """Kept only for its content words: no signal, no fact, no name, number or date (`PLAIN_SHARE`)."""
    section: str = CHRONOLOGICAL
    """Where a conversation's summary shows it (`sections`)."""
    terms: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
    """What it is about (`prose.terms`: names and numbers, content words), to tell a repeat."""

    def repeats(self, other: _Segment) -> bool:
        """Whether one of the two says little the other does not: the names and numbers of one are among the
        other's, and most of the content words of one (`REPEAT_SHARE`) too. Either may be kept, not both; symmetric,
        so that a summary read back keeps what it kept. A different name or number is never a repeat (`We live in
        Ashford now` after `We live in Millbrook now`: the newer value must be kept)."""
        (names, words), (other_names, other_words) = self.terms, other.terms
        if not (names <= other_names or other_names <= names):
            return False
        shared = len(words & other_words)
        return bool(shared) and shared >= REPEAT_SHARE * min(len(words), len(other_words))


class _Choice:
    """What a fallback summary keeps, and its estimated cost: each piece counted alone, plus its separator."""

    def __init__(self, target: int, *, structured: bool) -> None:
        """`structured`: a conversation's summary, in sections; else an agent session's, chronological."""
        self.target = target
        self.structured = structured
        self.facts: list[Fact] = []
        self.sentences: list[_Segment] = []
        self.listed: dict[str, int] = {}
        """The kept facts no kept sentence shows (the facts line), with their costs."""
        self.used = 0

    def add_facts(self, facts: Sequence[Fact], limit: float) -> None:
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
        """The best sentences that fit, none that repeats a kept one; one that shows a listed fact costs that much
        less, the first of its date (in its section) that much more (its date line), the first of its section
        its header."""
        for sentence in sorted(sentences, key=lambda s: (-s.score, s.position)):
            if self.structured and any(sentence.repeats(kept) for kept in self.sentences):
                continue
            shown = [fact for fact in sentence.facts if fact in self.listed]
            cost = count_text(sentence.text) + 1 - sum(self.listed[fact] for fact in shown)
            mates = [kept for kept in self.sentences if kept.section == sentence.section]
            if sentence.date is not None and all(kept.date != sentence.date for kept in mates):
                cost += count_text(date_line(sentence.date)) + 1
            if self.structured and not mates:
                cost += count_text(header(sentence.section)) + 1
            room = self.target * PLAIN_SHARE if sentence.plain else self.target
            if self.used + cost <= room:
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
        for section in ORDER if self.structured else (CHRONOLOGICAL,):
            kept = sorted((s for s in self.sentences if s.section == section), key=lambda s: s.position)
            if kept and self.structured:
                lines.append(header(section))
            date = None
            for sentence in kept:
                if sentence.date is not None and sentence.date != date:
                    date = sentence.date
                    lines.append(date_line(date))
                lines.append(sentence.text)
        return "\n".join(lines)


def _candidates(
    messages: Sequence[Mapping[str, Any]], date: str | None
) -> tuple[list[Fact], list[_Segment], list[str] | None]:
    """The facts of `messages` (first seen first, an earlier summary's before any new one; a later value of a key
    replaces an earlier one), their sentences (each once), and the conversation's speakers (None for an agent's
    session, whose summary stays chronological). A sentence is scored by what it says besides its facts: its
    signals (errors, paths, decisions…) and, in what people wrote, its information (`prose.information`). It
    keeps the date of its message (a stamp, or a summary's date line, holds until the next one; after a
    structured summary, its latest date) and the speaker its line starts with."""
    facts: dict[str, Fact] = {}
    sentences: dict[str, _Segment] = {}
    seen: set[str] = set()
    position = 0
    texts = list(labelled_texts(messages))
    speakers = None if _chronological(texts) else _speakers(texts)
    people = frozenset(name.lower() for name in speakers or _speakers(texts))
    date = short_date(date) if date is not None else None
    for label, text, kind in texts:
        bonus = SUMMARY_BONUS if kind == SUMMARY_LABEL else 0
        dates: list[str] = []
        structured = False
        for line in text.splitlines():
            if kind == TEXT:
                # A stamp dates the lines after it, also on a later line (a client that joins a speaker's turns).
                stamp, line = date_stamp(line)
                date = short_date(stamp) if stamp is not None else date
            listed = fact_line(line) if kind == SUMMARY_LABEL else None
            if listed is not None:
                for fact in listed:
                    add_fact(facts, Fact(position, fact, bonus))
                    position += 1
                continue
            if kind == SUMMARY_LABEL:
                if read_header(line) is not None:
                    # A section's first line has its date line: nothing before it dates it.
                    structured, date = True, None
                    continue
                stamp, rest = date_stamp(line)
                if stamp is not None and not rest.strip():
                    date = short_date(stamp)
                    dates.append(date)
                    continue
            prefix, line = _label_of(line, label, kind)
            who, line = speaker(line) if kind in (SUMMARY_LABEL, TEXT) else (None, line)
            prefix = who if who and speakers is not None else f"{prefix}: {who}" if who else prefix
            for sentence in _SENTENCE_END.split(line.strip()):
                sentence = sentence.strip()
                if not sentence or not any(ch.isalnum() for ch in sentence) or sentence in sentences:
                    continue
                found = facts_in(sentence) if kind in (SUMMARY_LABEL, TEXT) else []
                written = [sentence[start:end] for start, end in found]
                for fact in written:
                    add_fact(facts, Fact(position, fact, bonus))
                rest = remove(sentence, found)
                told = information(rest, seen, people) if kind in (SUMMARY_LABEL, TEXT) else None
                section = CHRONOLOGICAL if speakers is None else section_of(rest, tells_of_others(rest, people))
                # In a conversation, what is decided or open is told by its section's stricter words ("next door"
                # is no task): worth a little more than a fact.
                worded = told != 0 and speakers is None
                signals = max(_score(rest, worded), FACT_CONTEXT_SCORE if found else 0)
                signals += SECTION_SCORE if told and section in (DECISIONS, OPEN) else 0
                # An earlier summary's small talk is not worth keeping again before new facts.
                plain = bool(told) and not signals and not specific(rest, people)
                score = signals + (0 if plain else bonus) + (told or 0.0)
                seen.update(content_words(rest) if told is not None else ())
                shown = clip(sentence, MAX_SEGMENT_CHARS)
                if score > 0:
                    shows = tuple(fact for fact in written if fact in shown)
                    segment = _Segment(position, f"{prefix}: {shown}", score, shows, date, plain, section, terms(rest))
                    sentences[sentence] = segment
                position += 1
        if structured:
            # Its sections are not in the order of time: what follows it is as late as its latest date.
            date = latest(dates) or date
    return sorted(facts.values(), key=lambda f: (-f.score, f.position)), list(sentences.values()), speakers


def _chronological(texts: Sequence[tuple[str, str, str]]) -> bool:
    """Whether a range is an agent's session (tool calls or outputs, or an earlier summary that shows them): its
    summary keeps the order things happened in, not a conversation's sections."""
    for label, text, kind in texts:
        if kind not in (SUMMARY_LABEL, TEXT):
            return True
        if kind == SUMMARY_LABEL:
            for line in text.splitlines():
                prefix, rest = _label_of(line, label, kind)
                if prefix.split(": ")[-1].startswith("tool") or rest.startswith("called "):
                    return True
    return False


def _speakers(texts: Sequence[tuple[str, str, str]]) -> list[str]:
    """The speakers a transcript's lines start with, in the order they first speak, in what people wrote and
    earlier summaries (whose `People:` line names theirs)."""
    people: dict[str, None] = {}
    for label, text, kind in texts:
        if kind in (SUMMARY_LABEL, TEXT):
            for line in text.splitlines():
                named = read_header(line) if kind == SUMMARY_LABEL else None
                if named is not None:
                    people.update(dict.fromkeys(named[1]))
                    continue
                who, _ = speaker(_label_of(date_stamp(line)[1], label, kind)[1])
                if who is not None:
                    people[who] = None
    return list(people)


def _label_of(line: str, label: str, kind: str) -> tuple[str, str]:
    """(label, text) of one line: an earlier summary's line keeps the label it has (`user: …`, not `summary: user:
    …`, however often it is merged again)."""
    if kind == SUMMARY_LABEL:
        labelled = _LABEL.match(line)
        if labelled:
            return labelled.group()[:-2], line[labelled.end() :]
    return label, line


def _score(text: str, worded: bool = True) -> int:
    return sum(weight for pattern, weight in _SCORES if (worded or pattern not in _WORDED) and pattern.search(text))


def _first_sentences(messages: Sequence[Mapping[str, Any]]) -> str:
    firsts = []
    for role, text, _ in labelled_texts(messages):
        stripped = text.strip()
        if stripped:
            first = _SENTENCE_END.split(stripped.splitlines()[0])[0]
            firsts.append(f"{role}: {clip(first, FALLBACK_SENTENCE_CHARS)}")
    return "\n".join(firsts)
