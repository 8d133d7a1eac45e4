"""Which terms of a question recall looks up: identifier-like ones (`DEPLOY_REGION`, a path, a version, a
`camelCase` or quoted name, matched as phrases) and its content words (`support`, `painting`: matched by their stem
as a prefix, `paint*`), never stopwords; and which of them the working context does not show. A question whose
terms the context all shows is not looked up at all.

Pure, and kept apart from the index (`recall`): each term is tokenized exactly as FTS5's unicode61 tokenizer
does, so the MATCH expression, the tsquery and the excerpt's regular expression all find the same thing.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from proxy.compaction.prose import FILLERS, FUNCTION_WORDS

Term = tuple[str, ...]
"""One query term as the lowercase tokens FTS5's unicode61 tokenizer makes of it: `DEPLOY_REGION` is
("deploy", "region"), matched as a phrase. A content word's stem ends with `PREFIX` (("paint*",)): it matches
every word it begins (`painted`, `painting`)."""
PREFIX = "*"
"""Ends a stem (no token holds it: tokens are letters and digits)."""

MAX_QUERY_TERMS = 32
MAX_SCANNED_TERMS = 256
"""Terms of a huge query looked up in the visible text at most (identifier-like terms first)."""
FEW_TERMS = 32
"""Up to this many, a query's terms are each searched for in the visible text; past it, its tokens are gathered.
In a ~110 KB working context a term's search takes ~50 µs (~80 µs for one that shows only inside other words),
gathering the tokens ~3.7 ms: searching stays cheaper up to ~45 terms."""
MAX_TERM_TOKENS = 16

_TOKEN = re.compile(r"[^\W_]+")
"""What unicode61 keeps as a token: letters and digits; everything else separates."""
_CHUNK = re.compile(r"[^\s\"'`()\[\]{}<>,;!?=|*]+")
"""A word of the query as written, identifiers, paths and versions whole."""
_EDGE = ".:-/\\#@~^+&%$"
_STOPWORD_TEXT = """
    a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing done down during each either else etc even ever every
    few for from further get gets got had has have having he her here hers him his how however i if in into is
    it its itself just know let like made make many may me might mine more most much must my myself need no nor
    not now of off on once one only or other our ours out over own please really right said same say see she
    should show since so some still such sure tell than thank thanks that the their theirs them then there
    these they thing things this those though through to too under until up upon us use used using very want
    was way we well were what when where whether which while who whom whose why will with within without would
    yes yet you your yours yourself back earlier previous previously told mentioned remember recall agreed
    discussed decided don didn doesn isn aren wasn weren won wouldn couldn shouldn haven hasn hadn
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""Words that refer to nothing in particular, the meta words of a question about the past among them."""
_QUESTION_WORDS = (
    STOPWORDS | FUNCTION_WORDS | FILLERS | {"kind", "type", "lot", "happen", "happened", "recently", "ago"}
)
"""What a content word of a question is not: it asks or chats, it does not name what it asks about (small talk
looks nothing up)."""
_SUFFIXES = ("ings", "ing", "ies", "ied", "ers", "er", "ed", "es", "ly", "s", "e")
"""Endings cut off a content word to make its stem, the longest first (`paintings` → `paint*`, `dance` → `danc*`)."""
MIN_MATCHED_SHARE = 0.5
"""A passage recalled for its words holds at least this share of the question's terms (`Lookup.answers`)."""
MIN_STEM = 4
"""A shorter stem begins too many unrelated words (`car*`: career, carrot): the word is matched whole."""


@dataclass(frozen=True)
class Lookup:
    """What recall looks up for one question."""

    terms: tuple[Term, ...]
    """The question's terms that rank the passages: the unseen ones, then those the context shows."""
    unseen: tuple[Term, ...]
    """Those the working context does not show: a passage must hold one. None: nothing is looked up."""
    exact: frozenset[Term]
    """The exact references among `terms` (several tokens, `camelCase`, `ALLCAPS`, quoted: `DEPLOY_REGION`,
    `v2.3`, a quoted `"8080"`): a passage holding one the context does not show is what the question refers to,
    whatever else it asks. A bare number (`8080`, `20`) is not one (`numbers`)."""

    def answers(self, text: str) -> bool:
        """Whether a passage is about what the question asks (the threshold a ranked match must pass): it shows an
        unseen exact reference, or an unseen term and at least `MIN_MATCHED_SHARE` of the question's terms; a passage
        sharing one common word with a long question is not."""
        lowered = text.lower()
        found = {term for term in self.terms if _lowered_pattern(term).search(lowered) is not None}
        unseen = found.intersection(self.unseen)
        if unseen & self.exact:
            return True
        return bool(unseen) and len(found) >= math.ceil(MIN_MATCHED_SHARE * len(self.terms))


def lookup(query: str, visible_text: str) -> Lookup:
    """The question's terms and which of them `visible_text` does not show (the query's own text aside). A bare
    number it names ranks passages but is not looked up by itself: an agent's every prompt names some (`Turn 20`,
    a count) and every old tool output holds some, so a recall would come for it, and go at the next turn, a break
    of the prompt the upstream cached both ways."""
    named, exact, numbers = _named_terms(query)
    terms = [*named, *content_words(query, named)][:MAX_SCANNED_TERMS]
    if query:
        visible_text = visible_text.replace(query, " ")
    shown = _shown_in(visible_text, len(terms))
    unseen = [term for term in terms if not shown(term)][:MAX_QUERY_TERMS]
    if all(term in numbers for term in unseen):
        unseen = []
    hidden = set(unseen)
    ranked = [*unseen, *(term for term in terms if term not in hidden)][:MAX_QUERY_TERMS]
    return Lookup(tuple(ranked), tuple(unseen), frozenset(exact))


def content_words(query: str, named: Sequence[Term] = ()) -> list[Term]:
    """The plain words of a query that say what it is about (`support`, `group`, `painting`), as stems: no
    stopword or function word, nothing shorter than three letters, not a word of `named`; each once."""
    taken = {token for term in named for token in term}
    stems: dict[Term, None] = {}
    for match in _CHUNK.finditer(query):
        tokens = _TOKEN.findall(_possessive(match.group().strip(_EDGE)).lower())
        if len(tokens) != 1 or not tokens[0].isalpha():
            continue
        word = tokens[0]
        if len(word) < 3 or word in _QUESTION_WORDS or word in taken:
            continue
        stems.setdefault((stem(word),))
    return list(stems)


def stem(word: str) -> str:
    """A lowercase word's stem as a prefix term token (`paintings` → `paint*`), or the word itself when its stem
    would be shorter than `MIN_STEM` (`cars` → `cars`, matched whole)."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix):
            return word[: -len(suffix)] + PREFIX if len(word) - len(suffix) >= MIN_STEM else word
    return word + PREFIX if len(word) >= MIN_STEM else word


def _possessive(chunk: str) -> str:
    """`Melanie's` → `Melanie`: the name is what is asked about, and an index has it without the `'s` mostly."""
    for ending in ("'s", "’s"):
        if chunk.endswith(ending) and len(chunk) > len(ending):
            return chunk[: -len(ending)]
    return chunk


def query_terms(query: str) -> list[Term]:
    """The significant terms of a query, identifier-like ones (several tokens, digits) first, then names: no
    stopwords, no short or plain words, no punctuation; each once."""
    return _named_terms(query)[0]


def _named_terms(query: str) -> tuple[list[Term], set[Term], set[Term]]:
    """`query_terms`, those of them that are exact references (several tokens, or one marked as a name:
    `camelCase`, `ALLCAPS`, quoted, not just capitalized), and its bare numbers (one token of digits, unquoted:
    `20`, `8080`), which are not."""
    identifiers: dict[Term, None] = {}
    words: dict[Term, None] = {}
    marked: set[Term] = set()
    numbers: set[Term] = set()
    chunks: set[str] = set()
    for match in _CHUNK.finditer(query):
        if match.group() in chunks:
            continue
        chunks.add(match.group())
        tokens = tuple(_TOKEN.findall(_possessive(match.group().strip(_EDGE)).lower()))[:MAX_TERM_TOKENS]
        if not any(_significant(token) for token in tokens):
            continue
        if len(tokens) > 1 or any(token.isdigit() for token in tokens):
            identifiers.setdefault(tokens)
            if len(tokens) == 1:
                (marked if _quoted(query, match.start()) else numbers).add(tokens)
        elif kind := _named(query, match.start(), match.group().strip(_EDGE)):
            words.setdefault(tokens)
            if kind == MARKED:
                marked.add(tokens)
        if len(identifiers) >= MAX_SCANNED_TERMS:
            break
    named = [*identifiers, *words][:MAX_SCANNED_TERMS]
    numbers -= marked  # quoted somewhere: an exact reference
    return named, {*identifiers, *marked} - numbers, numbers


MARKED = 2
CAPITALIZED = 1


def _named(query: str, start: int, word: str) -> int:
    """Whether a one-word term names something: `MARKED` for `camelCase`, `ALLCAPS` or a quoted word,
    `CAPITALIZED` for a capitalized word inside a sentence (`Paris`, `Postgres`), 0 for a plain word (a content
    word at most, `content_words`)."""
    if any(character.isupper() for character in word[1:]) or _quoted(query, start):
        return MARKED
    before = query[:start].rstrip()
    return CAPITALIZED if word[:1].isupper() and bool(before) and before[-1] not in ".!?:\n" else 0


def _quoted(query: str, start: int) -> bool:
    """Whether the word at `start` opens a quotation (`"`, `'`, a backtick)."""
    return query[start - 1 : start] in ("`", '"', "'") if start else False


def _significant(token: str) -> bool:
    if token.isdigit():
        return len(token) >= 2
    return len(token) >= 3 and token not in STOPWORDS


def _shown_in(text: str, terms: int) -> Callable[[Term], bool]:
    """Whether a term shows in `text`, as a phrase between token boundaries (a stem: at the start of a token). A
    few terms are each looked for in the lowercased text (a substring search in C first, then `_lowered_pattern`);
    many are looked up among the text's tokens, gathered once (~3 ms)."""
    if terms <= FEW_TERMS:
        lowered = text.lower()
        return lambda term: (
            all(_bare(token) in lowered for token in term) and _lowered_pattern(term).search(lowered) is not None
        )
    vocabulary = set(_TOKEN.findall(text.lower()))
    ordered = sorted(vocabulary)

    def known(token: str) -> bool:
        if not token.endswith(PREFIX):
            return token in vocabulary
        at = bisect_left(ordered, token[:-1])
        return at < len(ordered) and ordered[at].startswith(token[:-1])

    return lambda term: (
        all(known(token) for token in term) and (len(term) == 1 or term_pattern(term).search(text) is not None)
    )


def tsquery(terms: Sequence[Term], required: Sequence[Term] | None = None) -> str:
    """The same query for PostgreSQL's `to_tsquery`: each term's tokens ANDed (a stem as a prefix, `paint:*`),
    the terms ORed, and with `required` (a subset) one of those in every match. The tokens are letters and digits
    only, as above. Not a phrase (`a <-> b`): a tsvector keeps no word position past 16,383, so a phrase deep in a
    long tool output would never match; the excerpt still looks for the phrase."""

    def any_of(chosen: Sequence[Term]) -> str:
        return " | ".join("(" + " & ".join(_ts_token(token) for token in term) + ")" for term in chosen)

    if required is None or len(required) == len(terms):
        return any_of(terms)
    return f"({any_of(required)}) & ({any_of(terms)})"


def match_expression(terms: Sequence[Term], required: Sequence[Term] | None = None) -> str:
    """An FTS5 MATCH expression: each term a quoted phrase (a stem a prefix phrase, `"paint" *`), ORed, and with
    `required` (a subset of them) one of those in every match; bm25 counts every phrase, so the required ones weigh
    double. Tokens are letters and digits only, so nothing in a query (`"`, `*`, `NEAR`, `:`, `-`) can become FTS5
    syntax."""

    def any_of(chosen: Sequence[Term]) -> str:
        return " OR ".join(_phrase(term) for term in chosen)

    if required is None or len(required) == len(terms):
        return any_of(terms)
    return f"({any_of(required)}) AND ({any_of(terms)})"


def _phrase(term: Term) -> str:
    if term[-1].endswith(PREFIX):
        return '"' + " ".join(map(_bare, term)) + '" *'
    return '"' + " ".join(term) + '"'


def _ts_token(token: str) -> str:
    return _bare(token) + ":*" if token.endswith(PREFIX) else token


def _bare(token: str) -> str:
    return token.removesuffix(PREFIX)


def _token_pattern(token: str) -> str:
    """A token as a regular expression; a stem also takes the rest of the word it begins."""
    return re.escape(_bare(token)) + (r"[^\W_]*" if token.endswith(PREFIX) else "")


@lru_cache(maxsize=1024)
def _lowered_pattern(term: Term) -> re.Pattern[str]:
    """`term_pattern` for lowercased text, led by the term's first token as a literal: the regular expression
    engine then looks for that literal at C speed (~0.1 ms for a working context, against ~3 ms for a pattern
    led by a lookbehind), and the boundary before it is checked after it."""
    first = re.escape(_bare(term[0]))
    lead = _token_pattern(term[0])[len(first) :]
    rest = "".join(r"[\W_]+" + _token_pattern(token) for token in term[1:])
    return re.compile(first + r"(?<![^\W_]" + first + ")" + lead + rest + r"(?![^\W_])")


@lru_cache(maxsize=1024)
def term_pattern(term: Term) -> re.Pattern[str]:
    """The term as a phrase between token boundaries, as FTS5 matches it (case aside)."""
    return re.compile(r"(?<![^\W_])" + r"[\W_]+".join(map(_token_pattern, term)) + r"(?![^\W_])", re.IGNORECASE)
