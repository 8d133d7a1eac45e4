"""The SQLite store's initial schema: the first three migrations of `proxy.store.migrations` (whose docstring
describes each table), creating the tables every later migration builds on: the message chain and its token
counts, the summaries, and the journal's steps and events. Shipped: never edited, only added to."""

from __future__ import annotations

from proxy.store.connection import Connection
from proxy.store.engine import run_script


def m001_history(connection: Connection) -> None:
    run_script(
        connection,
        """
        CREATE TABLE sessions (
            tenant TEXT NOT NULL,
            id TEXT NOT NULL,
            head_id TEXT REFERENCES messages(id),
            model TEXT,
            settings TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (tenant, id)
        );
        CREATE INDEX sessions_by_update ON sessions (tenant, updated_at);
        CREATE TABLE messages (
            id TEXT PRIMARY KEY,
            parent_id TEXT REFERENCES messages(id),
            depth INTEGER NOT NULL,
            role TEXT NOT NULL,
            body TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX messages_by_parent ON messages (parent_id);
        CREATE TABLE message_tokens (
            message_id TEXT NOT NULL REFERENCES messages(id),
            encoding TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            PRIMARY KEY (message_id, encoding)
        ) WITHOUT ROWID
        """,
    )


def m002_summaries(connection: Connection) -> None:
    run_script(
        connection,
        """
        CREATE TABLE summaries (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            start_depth INTEGER NOT NULL,
            end_depth INTEGER NOT NULL,
            end_id TEXT NOT NULL REFERENCES messages(id),
            content TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            original_tokens INTEGER NOT NULL,
            model TEXT NOT NULL,
            generated_by TEXT NOT NULL CHECK (generated_by IN ('llm', 'fallback')),
            replaces TEXT NOT NULL DEFAULT '[]',
            orphaned_at REAL,
            created_at REAL NOT NULL
        );
        CREATE INDEX summaries_by_end ON summaries (end_id)
        """,
    )


def m003_journal(connection: Connection) -> None:
    run_script(
        connection,
        """
        CREATE TABLE journal_steps (
            id INTEGER PRIMARY KEY,
            tenant TEXT NOT NULL,
            session_id TEXT,
            model TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            idempotency_key TEXT,
            stream INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('open', 'sealed', 'complete', 'interrupted', 'failed')),
            encoding TEXT,
            parent_message_id TEXT REFERENCES messages(id),
            message_id TEXT REFERENCES messages(id),
            content TEXT,
            tool_calls TEXT,
            finish_reason TEXT,
            usage TEXT,
            error TEXT,
            created_at REAL NOT NULL,
            sealed_at REAL
        );
        CREATE INDEX journal_steps_by_status ON journal_steps (status);
        CREATE INDEX journal_steps_by_session ON journal_steps (tenant, session_id);
        CREATE UNIQUE INDEX journal_steps_by_idempotency_key
            ON journal_steps (tenant, idempotency_key)
            WHERE idempotency_key IS NOT NULL AND status IN ('open', 'sealed', 'complete');
        CREATE INDEX journal_steps_by_key ON journal_steps (tenant, idempotency_key, id)
            WHERE idempotency_key IS NOT NULL;
        CREATE INDEX journal_steps_by_tenant ON journal_steps (tenant, id);
        CREATE TABLE journal_events (
            step_id INTEGER NOT NULL REFERENCES journal_steps(id),
            seq INTEGER NOT NULL,
            type TEXT NOT NULL CHECK (type IN ('text', 'tool_call', 'usage', 'done', 'error', 'chunk')),
            content TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (step_id, seq)
        ) WITHOUT ROWID
        """,
    )
