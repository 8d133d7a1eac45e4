"""The schema, as an ordered list of named migrations; each runs once and is recorded in `migrations`. The first
three, which create the tables every later one builds on, are in `proxy.store.initial_schema`.

Never edit a migration that has shipped: add the next one. Tables are named for what they hold so that a user
can open the file with `sqlite3` and read their conversations:

- `sessions`: a tenant's named line of conversation and its head (latest message).
- `messages`: the content-addressed chain; a message's id hashes its parent's id and its normalized content,
  so a re-sent history maps onto stored rows and an edit starts a branch. Nothing is ever deleted.
- `message_tokens`: each message's token count per tiktoken encoding, computed once.
- `summaries`: a summary of the contiguous chain range from depth `start_depth` to the message `end_id`
  (inclusive); valid on every branch that contains `end_id`. A summary replaced by a wider one is
  `orphaned_at`, never deleted.
- `message_variants`, `context_settings`: see `m004_conversations`.
- `journal_owners`: the processes serving the store, see `m005_step_owners`.
- `summaries.strategy`: which compaction strategy wrote a span, see `m006_strategies`.
- `pins`: messages a session keeps verbatim, see `m007_pins`.
- `compaction_events`: what each compaction did, see `m008_compaction_events`.
- `recall_messages` / `recall_index`: the full-text index of hidden messages, see `m009_recall`.
- `span_epochs`, `summaries.epoch`: what changed in a tenant's spans since a read, see `m013_span_epochs`;
  `span_epochs.cleared`: when they were last deleted, see `m015_lifecycle`.
- `journal_steps` / `journal_events`: one step per response, its upstream events appended before relay. A step
  remembers its tiktoken encoding, so recovery after a restart can seal its answer into history. An
  Idempotency-Key is held only by a live or successful step (open, sealed, complete): a request that failed or
  was interrupted can be retried with the same key, and every attempt stays readable. `journal_events` is an
  ordinary (rowid) table since `m010_journal_events_rowid`.
"""

from __future__ import annotations

from proxy.store.connection import Connection
from proxy.store.engine import Migration, run_script
from proxy.store.initial_schema import m001_history, m002_summaries, m003_journal


def m004_conversations(connection: Connection) -> None:
    """Real tools' conversations (docs/architecture.md, "Glossary": message chain, session).

    - `message_variants`: the other forms a node was re-sent in (a rewritten system prompt, a history restored
      with changed whitespace); the node's `body` stays the first form.
    - `context_settings`: settings (X-Context-Budget) attach to the message they were sent with and hold for
      what continues from it; a session's old settings move to its head.
    - `sessions.anchor_id`: the last message of a derived session's first request, by which later requests
      of the same conversation find it.
    - `journal_steps.context`: the numbers of the working context the step sent (tokens, budget, summaries).
    """
    run_script(
        connection,
        """
        CREATE TABLE message_variants (
            message_id TEXT NOT NULL REFERENCES messages(id),
            digest TEXT NOT NULL,
            body TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (message_id, digest)
        );
        CREATE TABLE context_settings (
            tenant TEXT NOT NULL,
            message_id TEXT NOT NULL REFERENCES messages(id),
            settings TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (tenant, message_id)
        );
        INSERT INTO context_settings (tenant, message_id, settings, created_at)
            SELECT tenant, head_id, settings, updated_at FROM sessions
            WHERE head_id IS NOT NULL AND settings NOT IN ('', '{}');
        ALTER TABLE sessions DROP COLUMN settings;
        ALTER TABLE sessions ADD COLUMN anchor_id TEXT REFERENCES messages(id);
        CREATE INDEX sessions_by_anchor ON sessions (tenant, anchor_id) WHERE anchor_id IS NOT NULL;
        ALTER TABLE journal_steps ADD COLUMN context TEXT
        """,
    )


def m005_step_owners(connection: Connection) -> None:
    """Who owns an open step (`proxy.journal.owners`), so one process's recovery leaves another's live streams.

    - `journal_owners`: one row per serving process (a random id per start), its host and pid, and its last
      heartbeat; deleted at a clean shutdown, or by another process once it is gone and its steps are settled.
    - `journal_steps.owner`: the owner that opened the step; NULL (every step written before this migration)
      is owned by nobody alive.
    """
    run_script(
        connection,
        """
        CREATE TABLE journal_owners (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL
        );
        ALTER TABLE journal_steps ADD COLUMN owner TEXT
        """,
    )


def m006_strategies(connection: Connection) -> None:
    """Spans written by every compaction strategy (`proxy.compaction.strategies`), not only by the summarizer.

    `strategy` names the writer: `summarize` (every summary before this migration), `goal-batch` (episodes),
    `sliding-window` (an omission marker: `generated_by` 'rule', no model) or `tool-results` (a mask: tool
    outputs in the range are sent as stubs; `content` is empty). `held`: written ahead of need by pre-compaction,
    used only once the context no longer fits without it. SQLite cannot relax a CHECK in place, so the table is
    rebuilt with its rows and ids.
    """
    run_script(
        connection,
        """
        CREATE TABLE summaries_new (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            start_depth INTEGER NOT NULL,
            end_depth INTEGER NOT NULL,
            end_id TEXT NOT NULL REFERENCES messages(id),
            content TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            original_tokens INTEGER NOT NULL,
            model TEXT NOT NULL,
            generated_by TEXT NOT NULL CHECK (generated_by IN ('llm', 'fallback', 'rule')),
            replaces TEXT NOT NULL DEFAULT '[]',
            orphaned_at REAL,
            created_at REAL NOT NULL,
            strategy TEXT NOT NULL DEFAULT 'summarize'
                CHECK (strategy IN ('summarize', 'goal-batch', 'sliding-window', 'tool-results')),
            held INTEGER NOT NULL DEFAULT 0
        );
        INSERT INTO summaries_new (id, tenant, start_depth, end_depth, end_id, content, tokens, original_tokens,
            model, generated_by, replaces, orphaned_at, created_at)
            SELECT id, tenant, start_depth, end_depth, end_id, content, tokens, original_tokens, model,
            generated_by, replaces, orphaned_at, created_at FROM summaries;
        DROP TABLE summaries;
        ALTER TABLE summaries_new RENAME TO summaries;
        CREATE INDEX summaries_by_end ON summaries (end_id)
        """,
    )


def m007_pins(connection: Connection) -> None:
    """Messages a session keeps verbatim in every working context (`POST /sessions/{id}/pins`).

    A pin names a node of the chain, so it holds on every request of the session whose path contains it.
    """
    run_script(
        connection,
        """
        CREATE TABLE pins (
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            message_id TEXT NOT NULL REFERENCES messages(id),
            created_at REAL NOT NULL,
            PRIMARY KEY (tenant, session_id, message_id)
        ) WITHOUT ROWID
        """,
    )


def m008_compaction_events(connection: Connection) -> None:
    """One row per compaction event (start, complete, error), kept per session for `GET /sessions/{id}/events`."""
    run_script(
        connection,
        """
        CREATE TABLE compaction_events (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            event TEXT NOT NULL CHECK (event IN ('start', 'complete', 'error')),
            strategy TEXT NOT NULL,
            range_start INTEGER,
            range_end INTEGER,
            tokens_before INTEGER,
            tokens_after INTEGER,
            duration_ms REAL,
            summary_id INTEGER,
            generated_by TEXT,
            model TEXT,
            background INTEGER NOT NULL DEFAULT 0,
            detail TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX compaction_events_by_session ON compaction_events (tenant, session_id, id)
        """,
    )


def m009_recall(connection: Connection) -> None:
    """The full-text index recall searches (`proxy.compaction.recall`), filled as messages become hidden.

    - `recall_messages`: which messages of a tenant are indexed; its `id` is the message's rowid in the index.
    - `recall_index`: an FTS5 table over each message's text and tool calls. It is contentless (the text is in
      `messages`), so it answers MATCH and bm25() but shows no text: `SELECT message_id FROM recall_messages
      WHERE id IN (SELECT rowid FROM recall_index WHERE recall_index MATCH 'word')`.
    """
    run_script(
        connection,
        """
        CREATE TABLE recall_messages (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            message_id TEXT NOT NULL REFERENCES messages(id),
            UNIQUE (tenant, message_id)
        );
        CREATE VIRTUAL TABLE recall_index USING fts5(
            text, content = '', tokenize = 'unicode61 remove_diacritics 2'
        )
        """,
    )


def m010_journal_events_rowid(connection: Connection) -> None:
    """`journal_events` as an ordinary rowid table: m003 made it WITHOUT ROWID, whose rows live in an index b-tree
    where a row past ~1,000 bytes (a 4 KiB page's index-payload limit) spills its rest to an overflow page of its
    own — a ~1 KB chunk's event took ~4.6 KB on disk. A rowid table keeps rows up to ~4,000 bytes in its leaf,
    and its (step_id, seq) key becomes a small index beside it. Rows and their order are kept."""
    run_script(
        connection,
        """
        CREATE TABLE journal_events_new (
            step_id INTEGER NOT NULL REFERENCES journal_steps(id),
            seq INTEGER NOT NULL,
            type TEXT NOT NULL CHECK (type IN ('text', 'tool_call', 'usage', 'done', 'error', 'chunk')),
            content TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (step_id, seq)
        );
        INSERT INTO journal_events_new (step_id, seq, type, content, created_at)
            SELECT step_id, seq, type, content, created_at FROM journal_events ORDER BY step_id, seq;
        DROP TABLE journal_events;
        ALTER TABLE journal_events_new RENAME TO journal_events
        """,
    )


def m011_model_corrections(connection: Connection) -> None:
    """What the replicas learned about each model's tokenizer and window (`proxy.budget.shared_corrections`)."""
    run_script(
        connection,
        """
        CREATE TABLE model_corrections (
            model TEXT PRIMARY KEY,
            factor REAL NOT NULL,
            context_window INTEGER,
            updated_at REAL NOT NULL
        )
        """,
    )


def m012_summarizer_calls(connection: Connection) -> None:
    """One row per summarizer model call the proxy made for a session, with the tokens the summarizer reported
    (`proxy.compaction.summarizer_calls`): the summarizer's share of a session's cost, shown per turn."""
    run_script(
        connection,
        """
        CREATE TABLE summarizer_calls (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            cached_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX summarizer_calls_by_session ON summarizer_calls (tenant, session_id, id)
        """,
    )


def m013_span_epochs(connection: Connection) -> None:
    """A tenant's span epoch, bumped by every write to its spans, and the epoch each span was last written at: a
    process that read a session's spans at some epoch reads only the rows written since, not the spans of its
    whole path again (`proxy.compaction.span_store`). Rows written before have epoch 0."""
    run_script(
        connection,
        """
        CREATE TABLE span_epochs (
            tenant TEXT PRIMARY KEY,
            epoch INTEGER NOT NULL
        );
        ALTER TABLE summaries ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX summaries_by_epoch ON summaries (tenant, epoch)
        """,
    )


def m014_spans_by_end_and_tenant(connection: Connection) -> None:
    """The spans ending on given messages are looked up by their end and tenant: with the end alone indexed,
    SQLite answered a tenant's lookup from `summaries_by_epoch`, walking every span the tenant ever wrote."""
    run_script(
        connection,
        "DROP INDEX summaries_by_end; CREATE INDEX summaries_by_end ON summaries (end_id, tenant)",
    )


def m015_lifecycle(connection: Connection) -> None:
    """Deleting sessions and tenants (`proxy.lifecycle`): `span_epochs.cleared` is the epoch at which the tenant's
    spans were last deleted (a process that read them before reads them afresh), sessions are found by how long
    they have been idle, across tenants (retention), and every column referring to a message is indexed by it: a
    deleted message's foreign keys are checked in each, which without an index was a scan of the table per
    message (10 s of a 4,000-message session's deletion beside 3,000 other sessions)."""
    run_script(
        connection,
        """
        ALTER TABLE span_epochs ADD COLUMN cleared INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX sessions_by_idle ON sessions (updated_at);
        CREATE INDEX sessions_by_head ON sessions (head_id);
        CREATE INDEX sessions_by_anchor_id ON sessions (anchor_id) WHERE anchor_id IS NOT NULL;
        CREATE INDEX journal_steps_by_parent ON journal_steps (parent_message_id) WHERE parent_message_id IS NOT NULL;
        CREATE INDEX journal_steps_by_message ON journal_steps (message_id) WHERE message_id IS NOT NULL;
        CREATE INDEX context_settings_by_message ON context_settings (message_id);
        CREATE INDEX pins_by_message ON pins (message_id);
        CREATE INDEX recall_messages_by_message ON recall_messages (message_id)
        """,
    )


MIGRATIONS: tuple[Migration, ...] = (
    m001_history,
    m002_summaries,
    m003_journal,
    m004_conversations,
    m005_step_owners,
    m006_strategies,
    m007_pins,
    m008_compaction_events,
    m009_recall,
    m010_journal_events_rowid,
    m011_model_corrections,
    m012_summarizer_calls,
    m013_span_epochs,
    m014_spans_by_end_and_tenant,
    m015_lifecycle,
)
