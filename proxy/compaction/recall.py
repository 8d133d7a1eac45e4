"""Recall: original passages of compacted history, brought back when the latest user message refers to them.

A summary keeps the gist; a question about an exact value (`DEPLOY_REGION`, a path, an error code) or about what
was said in passing ("when did she go to the support group?") needs the original. When some term of the latest
user message (an identifier, a name, a content word: `recall_terms`) is not shown by the working context, the
question's terms are looked up in a full-text index (SQLite FTS5 or a PostgreSQL tsvector, `m009_recall`) over
the session's hidden messages — summarized, omitted or stubbed —, ranked (bm25, ts_rank), and those that pass the
threshold (`Lookup.answers`) are sent with their hidden neighbours (the turn before and after: a hit's question or
answer) as one user message, within `context.recall_tokens`. A question the context shows all of recalls nothing,
unless asked to `fill` the room: then the hidden turns sharing any of its terms come next (best first, with their
neighbours), then the latest hidden turns (newest first, without a gap: what a sliding window would still show).

The index is filled lazily: a message is indexed the first time it is hidden and recall asks for it, once,
since messages are content-addressed and immutable. It is contentless (the text lives in `messages` and in
the path at hand), so it stores no second copy of anything; excerpts of long messages are cut here, a window
of lines around the place where the most query terms meet. Recall only ever adds context, so it never fails a
request: odd input gives no passages, and a failed index write is logged and leaves the index as it was.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from proxy.canonical.vocabulary import ORIGIN, Origin
from proxy.compaction.excerpts import message_excerpt, message_text
from proxy.compaction.recall_terms import Lookup, Term, lookup, match_expression, tsquery
from proxy.errors import StorageFull
from proxy.history.messages import StoredMessage
from proxy.offload import compute
from proxy.store.connection import Connection, Row
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
MAX_INDEX_CHARS = 8 * 1024 * 1024
"""Text indexed by one call at most (one message always): the rest is indexed by the next calls."""

_INSERT_DOCUMENT = {
    "sqlite": "INSERT INTO recall_index (rowid, text) VALUES (?, ?)",
    "postgresql": "INSERT INTO recall_index (id, document) VALUES (?, to_tsvector('simple', ?))",
}
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


INDEXED_IDS = 200_000
"""Messages this process knows are indexed (~150 bytes each): a long session's hidden history is not asked
about again on every request."""


@dataclass(frozen=True)
class _Checked:
    """How far a session's path is known indexed, as of its last request: every message before `end` (the path
    from depth `first` to `end_id`) is indexed but those at `shown` (sent verbatim then, perhaps never hidden)."""

    first: int
    end: int
    end_id: str
    shown: frozenset[int]


SESSIONS_CHECKED = 4096
"""Sessions whose indexed prefix a process remembers (`_Checked`: ~100 bytes and their shown positions)."""


class Recall:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._indexed: OrderedDict[tuple[str, str], None] = OrderedDict()
        """(tenant, message id) of messages known to be in the index: an indexed message stays indexed until its
        session or tenant is deleted (`forget_tenant`)."""
        self._checked: OrderedDict[tuple[str, str], _Checked] = OrderedDict()
        self._epochs: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """Tenant → its span epoch and last clearing as of this process's last look (`_forget_if_cleared`)."""

    def forget_tenant(self, tenant: str) -> None:
        """After a deletion of the tenant's rows (`proxy.lifecycle`): the index entries of what it remembers may
        be gone, and the same messages sent again (the same ids) must be indexed again."""
        for key in [key for key in self._indexed if key[0] == tenant]:
            del self._indexed[key]
        for key in [key for key in self._checked if key[0] == tenant]:
            del self._checked[key]
        self._epochs.pop(tenant, None)

    async def _forget_if_cleared(self, tenant: str) -> None:
        """A deletion by another process (a replica, the CLI) moves the tenant's span epoch past a clearing, or
        takes its row with a purge (`proxy.lifecycle.forget`): what this process remembers of the tenant's index
        is then forgotten. One read by key, when recall looks something up."""
        row = await self._db.fetchone("SELECT epoch, cleared FROM span_epochs WHERE tenant = ?", (tenant,))
        now = (0, 0) if row is None else (int(row[0]), int(row[1]))
        seen = self._epochs.get(tenant)
        if seen is not None and (now[1] > seen[1] or now[0] < seen[0]):
            self.forget_tenant(tenant)
        self._epochs[tenant] = now
        self._epochs.move_to_end(tenant)
        while len(self._epochs) > SESSIONS_CHECKED:
            self.forget_tenant(next(iter(self._epochs)))  # a tenant no longer watched keeps nothing

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
    ) -> list[Passage]:
        """Best-matching passages among the messages of `path` the working context does not send verbatim (not
        at `shown`: summarized, omitted or stubbed) for the latest user message `query`, in path order.

        `visible_text` is the text the working context shows: a term found there is not looked up (the query's
        own text is not counted as shown). The result, sent as `recall_message`, costs at most `limit_tokens`
        (`count_message`); [] when the query refers to nothing found only in hidden history.
        """
        if limit_tokens <= 0 or not query or len(shown) >= len(path):
            return []
        asked = await compute(len(query) + len(visible_text), lookup, query, visible_text)
        if not asked.unseen and not fill:
            return []
        hits: list[int] = []
        related: list[int] = []
        if asked.terms:
            await self._index(tenant, session_id, path, shown)
        if asked.unseen:
            ranked = await self._rank(tenant, path, shown, self._expression(asked.terms, asked.unseen))
            texts = [message_text(path[position].message) for position in ranked]
            answering = await compute(sum(map(len, texts)), _answering, asked, texts)
            hits = [position for position, answers in zip(ranked, answering, strict=True) if answers][:MAX_HITS]
        if fill and asked.terms:
            ranked = await self._rank(tenant, path, shown, self._expression(asked.terms, None))
            related = [position for position in ranked if position not in hits][:MAX_HITS]
        tiers = [_Tier(hits, neighbours=True)]
        if fill:
            recent = (p for p in range(len(path) - 1, -1, -1) if p not in shown and path[p].role in NEIGHBOUR_ROLES)
            tiers += [_Tier(related, neighbours=True), _Tier(recent, neighbours=False)]
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
            for rank, hit in enumerate(group.positions):
                if used >= limit_tokens:
                    break
                around = (hit, hit - 1, hit + 1) if group.neighbours else (hit,)
                for near, position in enumerate(around):
                    if position in taken or position in shown or not 0 <= position < len(path):
                        continue
                    stored = path[position]
                    if near and stored.role not in NEIGHBOUR_ROLES:
                        continue
                    room = limit_tokens - used - count_text(_label(position, stored.role), encoding)
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

    async def _index(self, tenant: str, session_id: str, path: Sequence[StoredMessage], shown: Set[int]) -> None:
        """Index the hidden messages not indexed yet. What the session's last request left indexed carries over
        when `path` extends its path (a node's id hashes its ancestors', so one id says so): only the messages
        past it, and those it showed that are hidden now, are looked at, not a long path's every message."""
        await self._forget_if_cleared(tenant)
        key = (tenant, session_id)
        checked = self._checked.pop(key, None)
        if (
            checked is not None
            and path[0].depth == checked.first
            and len(path) >= checked.end
            and path[checked.end - 1].id == checked.end_id
        ):
            unhidden = (position for position in sorted(checked.shown) if position not in shown)
            looked = [*unhidden, *(position for position in range(checked.end, len(path)) if position not in shown)]
        else:
            looked = [position for position in range(len(path)) if position not in shown]
        known = self._indexed
        unknown = [position for position in looked if (tenant, path[position].id) not in known]
        left = await self._index_messages(tenant, [path[position] for position in unknown]) if unknown else set()
        end = min((position for position in unknown if path[position].id in left), default=len(path))
        if end:
            below = frozenset(position for position in shown if position < end)
            self._checked[key] = _Checked(path[0].depth, end, path[end - 1].id, below)
            while len(self._checked) > SESSIONS_CHECKED:
                self._checked.popitem(last=False)

    async def _index_messages(self, tenant: str, unknown: Sequence[StoredMessage]) -> set[str]:
        """Index those of `unknown` not in the index yet, the newest first, within `MAX_INDEX_CHARS`; the ids of
        those still not indexed (left for the next call, or not written)."""
        rows = await self._db.fetchall(
            "SELECT message_id FROM recall_messages WHERE tenant = ? "
            "AND message_id IN (SELECT value FROM json_each(?))",
            (tenant, id_array(message.id for message in unknown)),
        )
        indexed = {row[0] for row in rows}
        self._remember(tenant, indexed)
        batch: list[StoredMessage] = []
        size = 0
        # Newest first: what was hidden last is what a question most likely reaches back for.
        for message in reversed(unknown):
            if message.id in indexed:
                continue
            if batch and size + rough_size(message.message) > MAX_INDEX_CHARS:
                break
            batch.append(message)
            size += rough_size(message.message)
        left = {message.id for message in unknown} - indexed
        if not batch:
            return left
        documents = await compute(size, _documents, batch)

        insert_document = _INSERT_DOCUMENT[self._db.dialect]

        def write(connection: Connection) -> None:
            for message_id, text in documents:
                row = connection.execute(
                    "INSERT OR IGNORE INTO recall_messages (tenant, message_id) VALUES (?, ?) RETURNING id",
                    (tenant, message_id),
                ).fetchone()
                if row is not None:  # not indexed meanwhile by a concurrent request
                    connection.execute(insert_document, (row[0], text))

        failures: tuple[type[Exception], ...] = (*self._db.errors, StorageFull)
        try:
            await self._db.write(write, bulk=True)
        except failures as exc:
            log.warning("recall: indexing %d message(s) failed, recalling from the index as it is: %s", len(batch), exc)
            return left
        self._remember(tenant, [message_id for message_id, _ in documents])
        return left - {message_id for message_id, _ in documents}

    def _remember(self, tenant: str, message_ids: Iterable[str]) -> None:
        for message_id in message_ids:
            self._indexed[(tenant, message_id)] = None
        while len(self._indexed) > INDEXED_IDS:
            self._indexed.popitem(last=False)

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


def _documents(messages: Sequence[StoredMessage]) -> list[tuple[str, str]]:
    return [(message.id, message_text(message.message)) for message in messages]
