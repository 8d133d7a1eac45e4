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
    _shown_in,
    match_expression,
    query_terms,
    term_pattern,
    unseen_terms,
)
from proxy.store.migrations import m001_history, m009_recall

QUESTION = "what was the DEPLOY_REGION we agreed on?"
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
    """The lookup among all the text's tokens, for any number of terms."""
    terms = query_terms(query)
    if query:
        visible_text = visible_text.replace(query, " ")
    vocabulary = set(re.findall(r"[^\W_]+", visible_text.lower()))
    unseen = [
        term
        for term in terms
        if not all(token in vocabulary for token in term)
        or (len(term) > 1 and not term_pattern(term).search(visible_text))
    ]
    return unseen[:32]


@pytest.mark.parametrize("seed", range(30))
def test_a_few_terms_searched_one_by_one_are_found_as_among_the_tokens(seed: int) -> None:
    rng = random.Random(seed)
    words = ["deploy", "region", "eu-west-1", "Zürich", "k8s", "v2.3.1", "the", "cluster", "node_pool", "x9"]
    query = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 8)))
    visible = " ".join(rng.choice([*words, "deployment", "regions", "Z\u00fcrich", "-", "_"]) for _ in range(60))
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
