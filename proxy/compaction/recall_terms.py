"""Which terms of a question recall looks up: identifier-like ones (`DEPLOY_REGION`, a path, a version, a
`camelCase` or quoted name), never stopwords or plain prose, and not those the working context already shows.

Pure, and kept apart from the index (`recall`): each term is tokenized exactly as FTS5's unicode61 tokenizer
does, so the MATCH expression, the tsquery and the excerpt's regular expression all find the same thing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

Term = tuple[str, ...]
"""One query term as the lowercase tokens FTS5's unicode61 tokenizer makes of it: `DEPLOY_REGION` is
("deploy", "region"), matched as a phrase."""

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


def query_terms(query: str) -> list[Term]:
    """The significant terms of a query, identifier-like ones (several tokens, digits) first, then names: no
    stopwords, no short or plain words, no punctuation; each once."""
    identifiers: dict[Term, None] = {}
    words: dict[Term, None] = {}
    chunks: set[str] = set()
    for match in _CHUNK.finditer(query):
        if match.group() in chunks:
            continue
        chunks.add(match.group())
        tokens = tuple(_TOKEN.findall(match.group().strip(_EDGE).lower()))[:MAX_TERM_TOKENS]
        if not any(_significant(token) for token in tokens):
            continue
        if len(tokens) > 1 or any(token.isdigit() for token in tokens):
            identifiers.setdefault(tokens)
        elif _named(query, match.start(), match.group().strip(_EDGE)):
            words.setdefault(tokens)
        if len(identifiers) >= MAX_SCANNED_TERMS:
            break
    return [*identifiers, *words][:MAX_SCANNED_TERMS]


def _named(query: str, start: int, word: str) -> bool:
    """Whether a one-word term names something: `camelCase`, `ALLCAPS`, a quoted word, or a capitalized word
    inside a sentence (`Paris`, `Postgres`). Plain words are left out: prose shares its vocabulary from turn to turn,
    and recalling passages for them costs tokens and the prompt's prefix for nothing."""
    if any(character.isupper() for character in word[1:]) or query[start - 1 : start] in ("`", '"', "'"):
        return True  # camelCase, ALLCAPS, or quoted as a name
    before = query[:start].rstrip()
    return word[:1].isupper() and bool(before) and before[-1] not in ".!?:\n"


def _significant(token: str) -> bool:
    if token.isdigit():
        return len(token) >= 2
    return len(token) >= 3 and token not in STOPWORDS


def unseen_terms(query: str, visible_text: str) -> list[Term]:
    """The query's terms that `visible_text` does not show (the query's own text aside), at most
    `MAX_QUERY_TERMS`."""
    terms = query_terms(query)
    if query:
        visible_text = visible_text.replace(query, " ")
    shown = _shown_in(visible_text, len(terms))
    return [term for term in terms if not shown(term)][:MAX_QUERY_TERMS]


def _shown_in(text: str, terms: int) -> Callable[[Term], bool]:
    """Whether a term shows in `text`, as a phrase between token boundaries. A few terms are each looked for in
    the lowercased text (a substring search in C first, then `_lowered_pattern`); many are looked up among the
    text's tokens, gathered once (~3 ms)."""
    if terms <= FEW_TERMS:
        lowered = text.lower()
        return lambda term: (
            all(token in lowered for token in term) and _lowered_pattern(term).search(lowered) is not None
        )
    vocabulary = set(_TOKEN.findall(text.lower()))
    return lambda term: (
        all(token in vocabulary for token in term) and (len(term) == 1 or term_pattern(term).search(text) is not None)
    )


def tsquery(terms: Sequence[Term]) -> str:
    """The same query for PostgreSQL's `to_tsquery`: each term's tokens ANDed, the terms ORed; the tokens are
    letters and digits only, as above. Not a phrase (`a <-> b`): a tsvector keeps no word position past 16,383,
    so a phrase deep in a long tool output would never match; the excerpt still looks for the phrase."""
    return " | ".join("(" + " & ".join(term) + ")" for term in terms)


def match_expression(terms: Sequence[Term]) -> str:
    """An FTS5 MATCH expression: each term a quoted phrase, ORed. Tokens are letters and digits only, so nothing
    in a query (`"`, `*`, `NEAR`, `:`, `-`) can become FTS5 syntax."""
    return " OR ".join('"' + " ".join(term) + '"' for term in terms)


@lru_cache(maxsize=1024)
def _lowered_pattern(term: Term) -> re.Pattern[str]:
    """`term_pattern` for lowercased text, led by the term's first token as a literal: the regular expression
    engine then looks for that literal at C speed (~0.1 ms for a working context, against ~3 ms for a pattern
    led by a lookbehind), and the boundary before it is checked after it."""
    first = re.escape(term[0])
    rest = "".join(r"[\W_]+" + re.escape(token) for token in term[1:])
    return re.compile(first + r"(?<![^\W_]" + first + ")" + rest + r"(?![^\W_])")


@lru_cache(maxsize=1024)
def term_pattern(term: Term) -> re.Pattern[str]:
    """The term as a phrase between token boundaries, as FTS5 matches it (case aside)."""
    return re.compile(r"(?<![^\W_])" + r"[\W_]+".join(map(re.escape, term)) + r"(?![^\W_])", re.IGNORECASE)
