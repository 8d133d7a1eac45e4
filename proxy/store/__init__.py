"""The store: `database` (one writer with group commit, reads, locks across processes) over an engine, SQLite
(`sqlite`) or PostgreSQL (`postgres`); the schema's migrations for each; moving a store between them (`transfer`)."""
