"""How much a sentence of ordinary language tells, for the extractive fallback (`extractive`): its names,
numbers, dates and content words not seen before, with greetings and fillers worth nothing.

Chat between people is not code: what matters later is who did what, where and when ("my colleague Vera adopted
a hamster named Biscuit"), not `key=value` facts or error lines, and most of its sentences are pleasantries
("Thanks, Maria.", "Yeah, John!") that tell nothing. A sentence's information is counted in words, not in its
position or its length alone: a content word counts fully the first time the range uses it and little after.
Also here: the date stamp a chat client puts before a message (`[1:56 pm on 8 May, 2023] …`) and the speaker a
transcript names at the start of a line (`Caroline: …`), which a kept sentence carries with it. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence, Set

from proxy.history.messages import StoredPath
from proxy.tokens import content_text

NAME_WEIGHT = 1.5
"""A proper name (a person, a place, a title) is what a later question most often asks about."""
NUMBER_WEIGHT = 1.5
"""A number, a date, a month or a day: the when and how many."""
TIME_WORD_WEIGHT = 1.0
"""`yesterday`, `last week`: the sentence says when something happened relative to its date."""
SEEN_WORD_WEIGHT = 0.25
"""A content word the range already used counts a little: it repeats, but it may still be the point."""
MIN_INFORMATION = 1.5
"""Below this a sentence is a pleasantry or small talk: it is not kept for what it says."""
INFORMATION_CAP = 8.0
INTERJECTION_WEIGHT = 0.5
"""A sentence opened by an interjection (`Wow, …`, `Thanks for …`) reacts to what was said: its content words
count this much."""
QUESTION_WEIGHT = 0.5
"""A question asks more than it tells: what it says counts this much (its answer is what a summary keeps)."""
DATE_LOOKBACK = 500
"""Messages looked back at for the date in force: a chat's sessions are stamped far more often than this."""
STAMP_CHARS = 4_000
"""Characters of a message looked at for stamps: a speaker's joined turns, not a tool's long output."""


def _listed(words: str) -> frozenset[str]:
    return frozenset(words.split())


MONTHS = (
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
)
_MONTHS = _listed(MONTHS)
_DAYS = _listed("monday tuesday wednesday thursday friday saturday sunday")
_TIME_WORDS = _listed(
    "yesterday today tonight tomorrow week weekend month year ago morning evening night birthday anniversary"
)
FUNCTION_WORDS = _listed(
    """
    a about above after again against all almost also am an and any are aren't as at be because been before being
    below between both but by can can't could couldn't did didn't do does doesn't doing don't down during each few
    for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself him
    himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most mustn't my
    myself no nor not of off on once only or other ought our ours ourselves out over own same shan't she she'd
    she'll she's should shouldn't so some such than that that's the their theirs them themselves then there
    there's these they they'd they'll they're they've this those through to too under until up very was wasn't we
    we'd we'll we're we've were weren't what what's when when's where where's which while who who's whom why why's
    with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves just really much many
    lot lots bit even still ever every thing things stuff something anything everything nothing way kind sort
    get got gets getting go goes going gone went make made come came take took know knew think thought feel felt
    say said tell told want wanted like liked look looks see seen saw let lets keep kept need needs try tried
    one ones also maybe perhaps actually definitely totally absolutely probably quite pretty well back around
    """
)
"""Words that carry grammar, not content: a sentence (or a question, for `recall_terms`) made of them says nothing."""
FILLERS = _listed(
    """
    hey hi hello hiya yo bye goodbye thanks thank cheers welcome yeah yes yep yup nope okay ok alright sure wow
    whoa oh ah aw aww haha hahaha lol omg hmm um uh great good nice cool awesome amazing lovely wonderful fantastic
    fun glad happy sorry proud excited congrats congratulations cute sweet beautiful incredible super love loved
    agree agreed exactly right true totally same soon later care chat chatting talk talking talked catch
    hear heard hope hoping miss missed glad enjoy enjoyed appreciate appreciated means mean meant sounds sound
    guess wish wishes luck best especially wanted inspiring awesome interesting tough hard mind time times day
    plan plans overall reasonable moment help helps helping helpful idea ideas approach sense fine pieces fit
    together hurry anyway whatever stuff point points honestly basically literally seems seem
    """
)
"""Words of small talk: a sentence (or a message, for `recall_terms`) that has only these tells nothing."""
_INTERJECTIONS = _listed(
    """
    hey hi hello hiya yo thanks thank cheers congrats congratulations wow whoa oh ah aw aww yeah yes yep sorry
    bye goodbye haha hahaha lol omg ok okay dear glad nice great awesome cool lovely
    """
)
_NAME = r"[A-Z][\w'’-]*"
_VOCATIVE = re.compile(
    r"(?:^|(?P<before>\S*)[,;]\s*|\b(?:" + "|".join(sorted(_INTERJECTIONS)) + r")[,!]?\s+)"
    rf"(?P<name>{_NAME})(?=\s*(?:[,.!?;]|$))",
    re.IGNORECASE,
)
"""A name called out to the one spoken to: set off by a comma (`No doubts, Caroline.`), after an interjection
(`Hey Mel!`), or alone before a comma at the start (`Caroline, look!`)."""
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d[\d:.,/-]*")
_STAMP = re.compile(r"^\[(?P<date>[^\[\]\n]{3,60})\]\s*")
_LINE_STAMP = re.compile(r"(?:^|\n)\[(?P<date>[^\[\]\n]{3,60})\]")
_TIME_OF_DAY = re.compile(r"^\d{1,2}[:.]\d{2}(?:\s*[ap]\.?m\.?)?\s+on\s+(?P<day>.+)$", re.IGNORECASE)
_DATE_LIKE = re.compile(r"\b\d{4}\b|\b\d{1,2}:\d{2}\b|\b(?:" + "|".join(MONTHS.split()) + r")\b", re.IGNORECASE)
_SPEAKER = re.compile(r"^(?P<speaker>[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}): (?=[A-Za-z])")
_NOT_SPEAKERS = _listed(
    """
    error errors warning note notes todo fixme summary update answer question step result output input example usage
    exception traceback fatal info debug hint tip reason cause fix status facts user assistant system tool people
    """
)
"""Labels a line may start with that name no one: `Error: connection refused` is not said by Error."""


def date_stamp(text: str) -> tuple[str | None, str]:
    """(the date a message starts with, the rest): `[1:56 pm on 8 May, 2023] Hey!` → (`1:56 pm on 8 May, 2023`,
    `Hey!`). Only a bracket that reads as a date (a year, a time of day or a month) is a stamp."""
    match = _STAMP.match(text)
    if match is None or not _DATE_LIKE.search(match.group("date")):
        return None, text
    return match.group("date"), text[match.end() :]


def short_date(stamp: str) -> str:
    """The day of a stamp without its time of day (`1:56 pm on 8 May, 2023` → `8 May, 2023`): what a summary
    shows before a date's sentences, for a third of the tokens."""
    match = _TIME_OF_DAY.match(stamp.strip())
    if match is None or not _DATE_LIKE.search(match.group("day")):
        return stamp
    return match.group("day")


def specific(sentence: str, people: Set[str] = frozenset()) -> bool:
    """Whether a sentence names someone or something (not its listener), or gives a number, a date or a time
    (`yesterday`, `next month`): what a question asks for. A sentence without (`I have been trying to cook more at
    home`) is kept only while there is room."""
    words = _WORD.findall(sentence)
    return bool(
        _told_names(sentence, words, people) or _numbers(words) or any(word.lower() in _TIME_WORDS for word in words)
    )


def _told_names(sentence: str, words: Sequence[str], people: Set[str]) -> set[str]:
    """The names a sentence tells of: not one it calls out to its listener, nor one of the chat's `people`."""
    return {name for name in _names(words) - _vocatives(sentence) if not _one_of(name.lower(), people)}


def _names(words: Sequence[str]) -> set[str]:
    """Capitalized words inside the sentence (its first word is capitalized anyway), months and days aside."""
    names = {w for i, w in enumerate(words) if i > 0 and w[0].isupper() and w.lower() not in _MONTHS | _DAYS}
    return names - {"I", "I'm", "I've", "I'd", "I'll"}


def _vocatives(sentence: str) -> set[str]:
    """The names `sentence` calls out to its listener (`_VOCATIVE`), not after another capitalized word
    (`Portland, Oregon.` is a place)."""
    called = set()
    for match in _VOCATIVE.finditer(sentence):
        name, before = match.group("name"), match.group("before")
        if name[0].isupper() and not (before and before[0].isupper() and before.lower() not in _INTERJECTIONS):
            called.add(name)
    return called


def _one_of(name: str, people: Set[str]) -> bool:
    """Whether a lowercase name is one of `people` or the short form of one (`mel` for `melanie`)."""
    return name in people or (len(name) >= 3 and any(person.startswith(name) for person in people))


def _numbers(words: Sequence[str]) -> set[str]:
    """Numbers, and month and day names inside the sentence (`May I…` is no date)."""
    return {
        w for i, w in enumerate(words) if w[0].isdigit() or (i > 0 and w[0].isupper() and w.lower() in _MONTHS | _DAYS)
    }


def date_in_force(texts: Sequence[str], before: int) -> str | None:
    """The date of the last stamp before position `before` (what holds for the messages after it), looking back
    at most `DATE_LOOKBACK` messages; None if none is stamped. A stamp may start any line of a message (a client
    that joins a speaker's turns into one message puts a session's stamp on the line that starts it)."""
    for index in range(before - 1, max(-1, before - 1 - DATE_LOOKBACK), -1):
        for match in reversed(list(_LINE_STAMP.finditer(texts[index][:STAMP_CHARS]))):
            if _DATE_LIKE.search(match.group("date")):
                return match.group("date")
    return None


def date_before(path: StoredPath, start: int) -> str | None:
    """The date stamp in force where a range of `path` starts (`date_in_force`): the sentences of a chat's session
    keep its date when the session's first message fell in an earlier range."""
    first = max(0, start - DATE_LOOKBACK)
    texts = [content_text(stored.message.get("content"))[:STAMP_CHARS] for stored in path[first:start]]
    return date_in_force(texts, len(texts))


def date_line(date: str) -> str:
    """The line a summary puts before the sentences of one date; `date_stamp` reads it back."""
    return f"[{date}]"


def speaker(line: str) -> tuple[str | None, str]:
    """(the speaker a transcript line starts with, the rest): `Caroline: I went…` → (`Caroline`, `I went…`)."""
    match = _SPEAKER.match(line)
    if match is None or match.group("speaker").lower() in _NOT_SPEAKERS:
        return None, line
    return match.group("speaker"), line[match.end() :]


def tells_of_others(sentence: str, people: Set[str] = frozenset()) -> bool:
    """Whether a sentence names someone or something other than its listener and the chat's `people`."""
    return bool(_told_names(sentence, _WORD.findall(sentence), people))


def terms(sentence: str) -> tuple[frozenset[str], frozenset[str]]:
    """What a sentence is about, to tell a sentence that repeats another: (its names and numbers, its content
    words)."""
    words = _WORD.findall(sentence)
    return frozenset(w.lower() for w in _names(words) | _numbers(words)), frozenset(content_words(sentence))


def content_words(sentence: str) -> list[str]:
    """The sentence's words that say something: not function words, fillers, numbers or names."""
    words = []
    for index, word in enumerate(_WORD.findall(sentence)):
        lower = word.lower().strip("'’-")
        if len(lower) < 3 or lower in FUNCTION_WORDS or lower in FILLERS or word[0].isdigit():
            continue
        if word[0].isupper() and index > 0:
            continue
        words.append(lower)
    return words


def information(sentence: str, seen: Set[str], people: Set[str] = frozenset()) -> float:
    """What `sentence` tells, given the content words the range used before it (`seen`): names (not one called
    out to the listener), numbers and dates, time words, and its content words (new ones fully) with diminishing
    returns (the square root of their count: a long sentence is not worth more for its length alone; less after
    an interjection); less for a question; 0 for a sentence with no content word at all (a greeting, a
    thank-you, a name called out) or below `MIN_INFORMATION`. At most `INFORMATION_CAP`. `people`: the
    chat's speakers (lowercase), whose names a line mostly calls out to them (`No doubt, Jon you've got this.`)."""
    words = _WORD.findall(sentence)
    content = content_words(sentence)
    if not set(content) - _TIME_WORDS:
        return 0.0
    names, numbers = _told_names(sentence, words, people), _numbers(words)
    times = {w.lower() for w in words if w.lower() in _TIME_WORDS}
    distinct = set(content)
    new = distinct - seen
    worded = math.sqrt(len(new - _TIME_WORDS) + SEEN_WORD_WEIGHT * len(distinct - new - _TIME_WORDS))
    if words and words[0].lower() in _INTERJECTIONS:
        worded *= INTERJECTION_WEIGHT
    total = NAME_WEIGHT * len(names) + NUMBER_WEIGHT * len(numbers) + TIME_WORD_WEIGHT * min(1, len(times)) + worded
    if sentence.rstrip().endswith("?"):
        total *= QUESTION_WEIGHT
    return min(INFORMATION_CAP, total) if total >= MIN_INFORMATION else 0.0
