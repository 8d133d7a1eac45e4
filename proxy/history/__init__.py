"""History: every message a tenant ever sent or received, as a content-addressed chain (docs/architecture.md).

`chain` is the pure content addressing, `store` the SQLite-backed `History`, `caches` what a process keeps
between requests, and `answers` the one place an answer becomes a node of the chain.
"""
