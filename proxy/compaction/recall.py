"""Recall: original passages of compacted history, brought back when the latest user message refers to them.

A summary keeps the gist; a question about an exact value (`DEPLOY_REGION`, a path, an error code) or about what
was said in passing ("when did she go to the support group?") needs the original. When some term of the latest
user message (an identifier, a name, a content word: `recall_terms`) is not shown by the working context, the
question's terms are looked up in a full-text index (SQLite FTS5 or a PostgreSQL tsvector, `m009_recall`) over
the session's hidden messages — summarized, omitted or stubbed —, ranked (bm25, ts_rank), and those that pass the
threshold (`Lookup.answers`) are sent with their hidden neighbours (the turn before and after: a hit's question or
answer) as one user message, within `context.recall_tokens`. A question the context shows all of recalls nothing,
unless asked to `fill` the room: then the hidden turns sharing any of its terms come next (best first, with their
neighbours), then the latest hidden turns (newest first, without a gap: what a sliding window would still show;
the last one that does not fit whole as an excerpt). The hits and related turns may be held to a part of the room
(`asked_tokens`), so a large room's rest goes to the latest turns.

The index is filled lazily, as recall asks (`recall_index`); excerpts of long messages are cut here, a window
of lines around the place where the most query terms meet. Recall only ever adds context, so it never fails a
request: odd input gives no passages, and a failed index write is logged and leaves the index as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from proxy.canonical.vocabulary import ORIGIN, Origin
from proxy.compaction.excerpts import message_excerpt, message_text
from proxy.compaction.recall_index import RecallIndex
from proxy.compaction.recall_terms import Lookup, Term, lookup, match_expression, tsquery
from proxy.history.messages import StoredMessage
from proxy.offload import compute
from proxy.store.connection import Row
from proxy.store.database import Database, id_array
from proxy.tokens import count_message, count_text, rough_size

log = logging.getLogger(__name__)


RECALL_HEADER = "[Recalled from earlier in this conversation]"
MAX_HITS = 8
"""Matches recalled at most, each with its neighbours."""
MAX_PASSAGE_CHARS = 1600
"""A passage longer than this is an excerpt around its best match (about 400 tokens of prose)."""
MAX_NEIGHBOUR_CHARS = 800
"""A hit's neighbour (the message before or after it) is shown up to this, as context for the hit."""
MIN_PASSAGE_CHARS = 160
"""An excerpt is shrunk to fit what is left of the limit, but not below this: a shorter one says nothing."""
CHARS_PER_TOKEN = 4
"""A first guess of an excerpt's size from the tokens left; the count decides."""
MIN_RELATIVE_SCORE = 0.25
"""A match scoring below this share of the best one is noise (a common word), not a reference."""
MAX_CANDIDATES = 32

_RANK = {
    # bm25 is negative and so is the rank below: lower is better on both, as `_rank` reads it.
    "sqlite": "SELECT d.message_id AS message_id, m.depth AS depth, bm25(recall_index) AS score "
    "FROM recall_index JOIN recall_messages AS d ON d.id = recall_index.rowid "
    "JOIN messages AS m ON m.id = d.message_id "
    "WHERE recall_index MATCH ? AND d.tenant = ?{among} ORDER BY score, d.id LIMIT ?",
    "postgresql": "SELECT d.message_id AS message_id, m.depth AS depth, -ts_rank(i.document, q.query) AS score "
    "FROM recall_index AS i JOIN recall_messages AS d ON d.id = i.id JOIN messages AS m ON m.id = d.message_id, "
    "to_tsquery('simple', ?) AS q(query) "
    "WHERE i.document @@ q.query AND d.tenant = ?{among} ORDER BY score, d.id LIMIT ?",
}
"""Recall's two engine-specific statements: FTS5 on SQLite (`m009_recall`), a tsvector on PostgreSQL; `among`
restricts them to the ids of a JSON array (`_AMONG`) or not at all."""
_AMONG = " AND d.message_id IN (SELECT value FROM json_each(?))"
NEIGHBOUR_ROLES = frozenset(("user", "assistant", "tool"))
"""What a hit's neighbour may be: a turn of the conversation, not a system message."""
RANKED_FIRST = 8 * MAX_CANDIDATES
"""Matches of the whole tenant ranked before the hidden ones are picked from them (`Recall._rank`)."""


@dataclass(frozen=True)
class _Tier:
    """Positions to recall, best first, and whether each comes with its hidden neighbours."""

    positions: Iterable[int]
    neighbours: bool
    limit: int | None = None
    """What the passages may cost, with those of the tiers before it; None: the whole room."""


@dataclass(frozen=True)
class Passage:
    position: int
    """Index of the message in the path."""
    message_id: str
    role: str
    text: str
    """The excerpt shown: the whole message text when it is short."""
    tokens: int
    """What `text` costs (`count_text` in the request's encoding)."""


class Recall:
    def __init__(self, db: Database) -> None:
        self._db = db
        self.index = RecallIndex(db)

    def forget_tenant(self, tenant: str) -> None:
        """After a deletion of the tenant's rows (`proxy.lifecycle`): `RecallIndex.forget_tenant`."""
        self.index.forget_tenant(tenant)

    async def passages(
        self,
        tenant: str,
        session_id: str,
        path: Sequence[StoredMessage],
        shown: Set[int],
        visible_text: str,
        query: str,
        limit_tokens: int,
        encoding: str,
        *,
        fill: bool = False,
        asked_tokens: int | None = None,
    ) -> list[Passage]:
        """Best-matching passages among the messages of `path` the working context does not send verbatim (not
        at `shown`: summarized, omitted or stubbed) for the latest user message `query`, in path order.

        `visible_text` is the original text the working context shows: a term found there is not looked up (the query's
        own text is not counted as shown). The result, sent as `recall_message`, costs at most `limit_tokens`
        (`count_message`), of which the hits and the turns related to them at most `asked_tokens` (None: no less);
        [] when the query refers to nothing found only in hidden history.
        """
        if limit_tokens <= 0 or not query or len(shown) >= len(path):
            return []
        asked = await compute(len(query) + len(visible_text), lookup, query, visible_text)
        if not asked.unseen and not fill:
            return []
        hits: list[int] = []
        related: list[int] = []
        if asked.terms:
            await self.index.index_hidden(tenant, session_id, path, shown)
        if asked.unseen:
            ranked = await self._rank(tenant, path, shown, self._expression(asked.terms, asked.unseen))
            texts = [message_text(path[position].message) for position in ranked]
            answering = await compute(sum(map(len, texts)), _answering, asked, texts)
            hits = [position for position, answers in zip(ranked, answering, strict=True) if answers][:MAX_HITS]
        if fill and asked.terms:
            ranked = await self._rank(tenant, path, shown, self._expression(asked.terms, None))
            related = [position for position in ranked if position not in hits][:MAX_HITS]
        tiers = [_Tier(hits, neighbours=True, limit=asked_tokens)]
        if fill:
            recent = (p for p in range(len(path) - 1, -1, -1) if p not in shown and path[p].role in NEIGHBOUR_ROLES)
            tiers += [_Tier(related, neighbours=True, limit=asked_tokens), _Tier(recent, neighbours=False)]
        return await self._chosen(path, shown, tiers, asked.terms, limit_tokens, encoding)

    def _expression(self, terms: Sequence[Term], required: Sequence[Term] | None) -> str:
        if self._db.dialect == "sqlite":
            return match_expression(terms, required)
        return tsquery(terms, required)

    async def _chosen(
        self,
        path: Sequence[StoredMessage],
        shown: Set[int],
        tiers: Sequence[_Tier],
        terms: Sequence[Term],
        limit_tokens: int,
        encoding: str,
    ) -> list[Passage]:
        """The tiers' positions in turn, best first, each followed by its hidden neighbours where its tier says,
        while they fit `limit_tokens`; the least ranked dropped while the whole message does not fit; in path
        order."""
        chosen: list[tuple[tuple[int, int, int], Passage]] = []
        taken: set[int] = set()
        used = count_message(recall_message([]), encoding)
        for tier, group in enumerate(tiers):
            ceiling = limit_tokens if group.limit is None else min(group.limit, limit_tokens)
            for rank, hit in enumerate(group.positions):
                if used >= ceiling:
                    break
                around = (hit, hit - 1, hit + 1) if group.neighbours else (hit,)
                for near, position in enumerate(around):
                    if position in taken or position in shown or not 0 <= position < len(path):
                        continue
                    stored = path[position]
                    if near and stored.role not in NEIGHBOUR_ROLES:
                        continue
                    room = ceiling - used - count_text(_label(position, stored.role), encoding)
                    widest = MAX_NEIGHBOUR_CHARS if near else MAX_PASSAGE_CHARS
                    passage = await self._passage(position, stored, terms, room, encoding, widest) if room > 0 else None
                    if passage is None:
                        continue
                    chosen.append(((tier, rank, near), passage))
                    taken.add(position)
                    used += count_text(_label(passage.position, passage.role) + passage.text, encoding)
                if not group.neighbours and hit not in taken and hit not in shown:
                    break  # the latest hidden turns, newest first, as far as they fit: no gap
        # The sum of the parts is a close estimate; the whole message is what the working context pays.
        while chosen and count_message(recall_message(_in_order(chosen)), encoding) > limit_tokens:
            chosen.remove(max(chosen, key=lambda item: item[0]))
        return _in_order(chosen)

    async def _rank(
        self,
        tenant: str,
        path: Sequence[StoredMessage],
        shown: Set[int],
        expression: str,
    ) -> list[int]:
        """The matching positions of `path` not at `shown` (the hidden ones), best first, without the noise far
        below the best. The tenant's best `RANKED_FIRST` matches are asked for first, without sending every hidden
        id: when they hold `MAX_CANDIDATES` hidden ones, or are all the matches there are, those are the hidden
        ones' best (any better one would rank among them); else the hidden ids are sent."""
        first = path[0].depth if path else 0

        def hidden(rows: Sequence[Row]) -> list[tuple[int, float]]:
            return [
                (position, float(row["score"]))
                for row in rows
                if 0 <= (position := row["depth"] - first) < len(path)
                and position not in shown
                and path[position].id == row["message_id"]
            ]

        statement = _RANK[self._db.dialect]
        try:
            rows = await self._db.fetchall(statement.format(among=""), (expression, tenant, RANKED_FIRST))
            found = hidden(rows)
            if len(found) < MAX_CANDIDATES and len(rows) == RANKED_FIRST:
                ids = id_array(path[position].id for position in range(len(path)) if position not in shown)
                rows = await self._db.fetchall(
                    statement.format(among=_AMONG), (expression, tenant, ids, MAX_CANDIDATES)
                )
                found = hidden(rows)
        except self._db.errors as exc:
            log.warning("recall: the index refused the query %r: %s", expression[:200], exc)
            return []
        if not found:
            return []
        found = found[:MAX_CANDIDATES]
        best = found[0][1]  # bm25 is negative: lower is better
        return [position for position, score in found if score <= best * MIN_RELATIVE_SCORE]

    async def _passage(
        self, position: int, stored: StoredMessage, terms: Sequence[Term], room: int, encoding: str, widest: int
    ) -> Passage | None:
        size = rough_size(stored.message)
        max_chars = max(MIN_PASSAGE_CHARS, min(widest, room * CHARS_PER_TOKEN))
        while True:
            text = await compute(size, message_excerpt, stored.message, terms, max_chars)
            tokens = count_text(text, encoding)
            if tokens <= room or max_chars <= MIN_PASSAGE_CHARS:
                break
            max_chars = max(MIN_PASSAGE_CHARS, max_chars * room // tokens)
        if not text or tokens > room:
            return None
        return Passage(position=position, message_id=stored.id, role=stored.role, text=text, tokens=tokens)


def recall_message(passages: Sequence[Passage]) -> dict[str, Any]:
    """The user message the passages are sent as: a header line, then each passage under a label with its place
    in the conversation and its role. The same passages always give the same bytes."""
    parts = [RECALL_HEADER]
    parts.extend(_label(passage.position, passage.role) + passage.text for passage in passages)
    return {"role": "user", "content": "\n\n".join(parts), ORIGIN: Origin.RECALL}


def _label(position: int, role: str) -> str:
    return f"Message {position} ({role}):\n"


def _in_order(chosen: Sequence[tuple[tuple[int, int, int], Passage]]) -> list[Passage]:
    return sorted((passage for _, passage in chosen), key=lambda passage: passage.position)


# --- the pure parts ---------------------------------------------------------------------------------------------


def _answering(asked: Lookup, texts: Sequence[str]) -> list[bool]:
    return [asked.answers(text) for text in texts]
