"""History: every message a tenant ever sent or received, as a content-addressed chain (docs/architecture.md,
"Glossary": message chain, session).

`chain` is the pure content addressing, `store` the write path of `History` (what its locate finds and its save
refuses: `located`) and `reads` its reads (on either engine of `proxy.store`, with their SQL in `queries`),
`settings` what a session remembers from its headers, `pins` the messages it keeps verbatim, `caches` what a
process keeps between requests, and `answers` the one place an answer becomes a node of the chain.
"""
