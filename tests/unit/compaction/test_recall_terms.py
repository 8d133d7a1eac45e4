"""Which terms of a question recall looks up (`proxy.compaction.recall_terms`), and that none of them can become
FTS5 syntax."""

from __future__ import annotations

import random
import re
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.compaction.recall_terms import (
    FEW_TERMS,
    PREFIX,
    Lookup,
    _shown_in,
    content_words,
    lookup,
    match_expression,
    query_terms,
    stem,
    term_pattern,
    tsquery,
)
from proxy.store.initial_schema import m001_history
from proxy.store.migrations import m009_recall

QUESTION = "what was the DEPLOY_REGION we agreed on?"


def unseen_terms(query: str, visible_text: str) -> list[tuple[str, ...]]:
    return list(lookup(query, visible_text).unseen)


FACT = "DEPLOY_REGION=eu-west-3"
NASTY_QUERIES = [
    'say "hello',
    "DEPLOY_REGION*",
    "NEAR(deploy region, 2)",
    "text:DEPLOY_REGION",
    "-DEPLOY_REGION",
    "deploy AND OR NOT region",
    '"" ^ * : - + ( ) { } NEAR/3',
    "\x00\ufffd\U0001f600 ☃ ß İ",
    "x" * 10_000,
]


def test_query_terms_keep_identifiers_numbers_and_paths_and_drop_the_rest() -> None:
    terms = query_terms("What was the DEPLOY_REGION we agreed on? See src/proxy/app.py, port 8080, a 3 on it.")
    assert ("deploy", "region") in terms
    assert ("src", "proxy", "app", "py") in terms
    assert ("8080",) in terms
    flat = {token for term in terms for token in term}
    assert not flat & {"what", "was", "the", "we", "agreed", "on", "a", "3", "it", "see", "port"}  # plain words
    assert query_terms("Did we move the cache to Redis or keep `memcached` and cacheTTL?") == [
        ("redis",),
        ("memcached",),
        ("cachettl",),
    ]
    assert query_terms("") == []
    assert query_terms("?! ... -- the of and") == []


def test_terms_the_working_context_shows_are_not_looked_up() -> None:
    assert unseen_terms(QUESTION, "nothing relevant here") == [("deploy", "region")]
    assert unseen_terms(QUESTION, f"earlier: {FACT}") == []
    assert unseen_terms(QUESTION, "we deploy to the region") == [("deploy", "region")], "a phrase, not two words"
    # The latest user message is part of what is sent: its own words do not count as already shown.
    assert unseen_terms(QUESTION, f"be brief\n{QUESTION}") == [("deploy", "region")]


@given(st.text())
def test_no_query_becomes_fts_syntax(query: str) -> None:
    connection = sqlite3.connect(":memory:")
    try:
        m001_history(connection)
        m009_recall(connection)
        connection.execute("INSERT INTO recall_index (rowid, text) VALUES (1, ?)", (f"{FACT} {query}",))
        for text in [query, *NASTY_QUERIES]:
            expression = match_expression(unseen_terms(text, ""))
            if expression:
                connection.execute("SELECT rowid FROM recall_index WHERE recall_index MATCH ?", (expression,))
    finally:
        connection.close()


def _reference_unseen(query: str, visible_text: str) -> list[tuple[str, ...]]:
    """The lookup among all the text's tokens, for any number of terms (a stem: any token it begins)."""
    named = query_terms(query)
    terms = [*named, *content_words(query, named)]
    if query:
        visible_text = visible_text.replace(query, " ")
    vocabulary = set(re.findall(r"[^\W_]+", visible_text.lower()))

    def known(token: str) -> bool:
        if token.endswith(PREFIX):
            return any(word.startswith(token[:-1]) for word in vocabulary)
        return token in vocabulary

    unseen = [
        term
        for term in terms
        if not all(known(token) for token in term) or (len(term) > 1 and not term_pattern(term).search(visible_text))
    ]
    return unseen[:32]


@pytest.mark.parametrize("seed", range(30))
def test_a_few_terms_searched_one_by_one_are_found_as_among_the_tokens(seed: int) -> None:
    rng = random.Random(seed)
    words = [
        "deploy",
        "region",
        "eu-west-1",
        "Zürich",
        "k8s",
        "v2.3.1",
        "the",
        "cluster",
        "node_pool",
        "x9",
        "rollouts",
    ]
    query = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 8)))
    others = [*words, "deployment", "regions", "Z\u00fcrich", "-", "_", "rollout", "clustering"]
    visible = " ".join(rng.choice(others) for _ in range(rng.choice((3, 60))))
    assert len(query_terms(query)) <= FEW_TERMS
    assert unseen_terms(query, visible) == _reference_unseen(query, visible)


@pytest.mark.parametrize("count", [FEW_TERMS - 1, FEW_TERMS, FEW_TERMS + 1, 3 * FEW_TERMS])
def test_few_or_many_terms_are_found_alike(count: int) -> None:
    """Searched one by one (up to `FEW_TERMS`) or looked up among the gathered tokens (past it), the same terms
    are unseen: the reference walks every token."""
    rng = random.Random(count)
    names = [f"service_{index}" for index in range(count)]
    query = " ".join(names)
    visible = " ".join(rng.choice([*names[: count // 2], "service", "x_service_1", "node_pool"]) for _ in range(200))
    assert len(query_terms(query)) == count
    assert unseen_terms(query, visible) == _reference_unseen(query, visible)


@given(
    st.text(alphabet="abcXYZ 09_-./", max_size=60),
    st.lists(st.text(alphabet="abcxyz09", min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_a_few_terms_show_where_their_pattern_matches_the_text(text: str, tokens: list[str]) -> None:
    term = tuple(tokens)
    assert _shown_in(text, 1)(term) == (term_pattern(term).search(text) is not None)


def test_content_words_are_the_question_s_plain_words_as_stems() -> None:
    assert content_words("When did she go to the support group?") == [("support*",), ("group*",)]
    assert content_words("What did Melanie say about her paintings?", [("melanie",)]) == [("paint*",)]
    assert content_words("Is the dance studio open?") == [("danc*",), ("studio*",), ("open*",)]
    assert content_words("what is it, and how? did we?") == []
    assert content_words("Wow, that's so awesome, thanks! Love it, have fun.") == [], "small talk looks nothing up"
    assert content_words("v2.3 DEPLOY_REGION 8080 ok") == [], "identifiers and numbers are named terms, not words"
    assert stem("cars") == "cars", "a stem shorter than four letters is the word itself"
    assert stem("cat") == "cat"
    assert stem("adoption") == "adoption*"
    assert stem("researching") == "research*"


def test_a_bare_number_alone_looks_nothing_up() -> None:
    """An agent's prompt names a number each turn (`Turn 20`, a count) and its old tool outputs hold every small
    number: a recall for the number alone would come at one turn and go at the next, a break of the cached
    prompt both ways. Quoted, or beside another unseen term, it is still asked about."""
    command = "seq -f 'turn {n} row %g: alpha beta' 1 120"
    previous = f"Turn 19: run `{command.format(n=19)}` with the shell tool and tell me its last line."
    asked = lookup(f"Turn 20: run `{command.format(n=20)}` with the shell tool and tell me its last line.", previous)
    assert asked.unseen == ()
    assert ("20",) in asked.terms
    assert ("20",) not in asked.exact
    assert lookup("what ran on 8080?", "it ran on a port").unseen == ()
    quoted = lookup('what ran on "8080"?', "it ran on a port")
    assert quoted.unseen == (("8080",),)
    assert quoted.exact == frozenset({("8080",)})
    beside = lookup("what did DEPLOY_REGION hold at 8080?", "nothing")
    assert set(beside.unseen) >= {("8080",), ("deploy", "region")}
    assert beside.exact == frozenset({("deploy", "region")})
    assert lookup("what broke build-2041?", "").exact == frozenset({("build", "2041")}), "a number in an identifier"


def test_the_lookup_ranks_by_every_term_and_requires_an_unseen_one() -> None:
    question = "When did Caroline go to the LGBTQ support group?"
    asked = lookup(question, f"Caroline: my group meets on Tuesdays\n{question}")
    assert asked.unseen == (("lgbtq",), ("support*",))
    assert asked.terms == (("lgbtq",), ("support*",), ("caroline",), ("group*",))
    assert asked.exact == frozenset({("lgbtq",)}), "ALLCAPS is an exact reference, a capitalized name is not"
    assert match_expression(asked.terms, asked.unseen) == (
        '("lgbtq" OR "support" *) AND ("lgbtq" OR "support" * OR "caroline" OR "group" *)'
    )
    assert tsquery(asked.terms, asked.unseen) == (
        "((lgbtq) | (support:*)) & ((lgbtq) | (support:*) | (caroline) | (group:*))"
    )
    assert lookup(question, "Caroline and the LGBTQ support group, on Tuesdays").unseen == ()


def test_a_passage_answers_when_it_holds_an_unseen_term_and_half_the_question() -> None:
    asked = Lookup(
        terms=(("support*",), ("caroline",), ("group*",), ("weekly",)),
        unseen=(("support*",),),
        exact=frozenset(),
    )
    assert asked.answers("Caroline: I went to a support group yesterday")
    assert not asked.answers("Caroline: my group meets weekly"), "no unseen term"
    assert not asked.answers("thanks for your support"), "one term of four"
    exact = Lookup(
        terms=(("deploy", "region"), ("staging*",), ("config*",)),
        unseen=(("deploy", "region"),),
        exact=frozenset({("deploy", "region")}),
    )
    assert exact.answers("DEPLOY_REGION=eu-west-3"), "an unseen exact reference is enough"


def test_stems_match_as_prefixes_in_fts5() -> None:
    connection = sqlite3.connect(":memory:")
    try:
        m001_history(connection)
        m009_recall(connection)
        texts = ["I painted a lake sunrise", "the support group", "a pain in the neck", "paint"]
        for rowid, text in enumerate(texts, 1):
            connection.execute("INSERT INTO recall_index (rowid, text) VALUES (?, ?)", (rowid, text))
        expression = match_expression([("paint*",)])
        rows = connection.execute("SELECT rowid FROM recall_index WHERE recall_index MATCH ?", (expression,))
        assert sorted(row[0] for row in rows) == [1, 4]
        assert term_pattern(("paint*",)).search("She PAINTED it")
        assert not term_pattern(("paint*",)).search("repaint")
    finally:
        connection.close()
