"""The SQLite store: `database` (one writer with group commit, one reader) and `migrations` (the schema)."""
