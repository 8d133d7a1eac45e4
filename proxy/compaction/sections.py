"""The sections of a structured no-model summary of a conversation (`extractive`): who is who, what was told
with its date, what was decided, what is still open.

A summary of a chat is read later by a model that must answer from it, so it is laid out as the summarizer model
is asked to write one (`summary_text.INSTRUCTION`): `People:` with what was told of others (an older summary
listed the speakers there, `read_header` still reads it), then `Facts (dated):`, `Decisions:`, `Open threads:`,
each a run of `[date]` lines and `Speaker: sentence` lines in their order. Every kept sentence is in exactly one
section, chosen here from its words alone, so that a later merge that reads the summary back puts it in the same
section again. An agent's session (tool calls, outputs)
keeps the chronological form: there the order of call, error and fix is the point. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PEOPLE = "People"
FACTS = "Facts (dated)"
DECISIONS = "Decisions"
OPEN = "Open threads"
ORDER = (PEOPLE, FACTS, DECISIONS, OPEN)
"""The order sections are written in."""
CHRONOLOGICAL = ""
"""The section of every line in the chronological (agent session) form."""

_DECISION = re.compile(
    r"\b(?:decided|decide to|agreed to|agreed on|we agreed|chose|choose to|settled on|going with|made up (?:my|our) "
    r"mind|we will|we'll go)\b",
    re.IGNORECASE,
)
_OPEN = re.compile(
    r"\b(?:next (?:week|weekend|month|year|time|summer|spring|autumn|fall|winter)|tomorrow|planning|plan to|plans to|"
    r"going to|gonna|thinking (?:about|of)|can't wait|cannot wait|hope to|hoping to|looking forward|TODO|FIXME|"
    r"need to|needs to|still have to|open question|not sure yet|haven't decided)\b",
    re.IGNORECASE,
)
_RELATION = re.compile(
    r"\b(?:mom|mother|mum|dad|father|parents?|husband|wife|partner|boyfriend|girlfriend|fianc[ée]e?|sons?|"
    r"daughters?|kids?|children|child|baby|brothers?|sisters?|siblings?|cousins?|aunt|uncle|niece|nephew|"
    r"grand(?:ma|mother|pa|father|parents?|kids?)|friends?|colleagues?|co-?workers?|boss|neighbou?rs?|roommates?|"
    r"family|in-laws?|named|pets?|dogs?|cats?|puppy|kitten)\b",
    re.IGNORECASE,
)
_HEADER = re.compile(r"^(?P<section>People|Facts \(dated\)|Decisions|Open threads):$")
_PEOPLE_LINE = re.compile(r"^People: (?P<names>[^:]+)$")
_NAME_SEPARATOR = ", "
_NAME = re.compile(r"[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}")
_MONTH_NAMES = (
    "jan january", "feb february", "mar march", "apr april", "may", "jun june", "jul july", "aug august",
    "sep sept september", "oct october", "nov november", "dec december",
)  # fmt: skip
_MONTHS = {month: number for number, names in enumerate(_MONTH_NAMES, start=1) for month in names.split()}
_DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)? ([A-Za-z]+),? (\d{4})\b")
_MONTH_DAY_YEAR = re.compile(r"\b([A-Za-z]+) (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})\b")
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")


def section_of(sentence: str, told_names: bool) -> str:
    """The section a sentence of a conversation goes to: a decision, an open thread (a plan, a task, a question),
    what it tells of someone other than the speakers (`told_names`: it names someone, with a relation), or a fact."""
    if _DECISION.search(sentence):
        return DECISIONS
    if _OPEN.search(sentence) or sentence.rstrip().endswith("?"):
        return OPEN
    if told_names and _RELATION.search(sentence):
        return PEOPLE
    return FACTS


def header(section: str) -> str:
    """The line a section starts with. The people's names no speakers: each line names its own, and a list of
    names would only take the room of a sentence."""
    return f"{section}:"


def read_header(line: str) -> tuple[str, tuple[str, ...]] | None:
    """(section, speakers it names) if `line` starts a section (`header`), else None."""
    match = _HEADER.match(line)
    if match is not None:
        return match.group("section"), ()
    people = _PEOPLE_LINE.match(line)
    names = tuple(people.group("names").split(_NAME_SEPARATOR)) if people else ()
    # A model's `People:` line tells who is who in words: that is a line to keep, not a list of speakers.
    return (PEOPLE, names) if names and all(map(_NAME.fullmatch, names)) else None


def date_order(date: str) -> tuple[int, int, int] | None:
    """(year, month, day) of a date as chats stamp it (`8 May, 2023`, `May 8, 2023`, `2023-05-08`), or None: a
    merge reads the latest of a summary's dates, as its sections are not in the order of time."""
    iso = _ISO.search(date)
    if iso:
        return int(iso.group(1)), int(iso.group(2)), int(iso.group(3))
    for pattern, day_first in ((_DAY_MONTH_YEAR, True), (_MONTH_DAY_YEAR, False)):
        for match in pattern.finditer(date):
            day, month = (match.group(1), match.group(2)) if day_first else (match.group(2), match.group(1))
            number = _MONTHS.get(month.lower())
            if number is not None:
                return int(match.group(3)), number, int(day)
    return None


def latest(dates: Sequence[str]) -> str | None:
    """The latest of `dates` by `date_order`, the last one where they cannot be told apart."""
    if not dates:
        return None
    ordered = [(order, index) for index, order in enumerate(map(date_order, dates)) if order is not None]
    if len(ordered) < len(dates):
        return dates[-1]
    return dates[max(ordered)[1]]
