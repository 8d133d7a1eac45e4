"""The stream journal: every upstream event of a response, durable before it is relayed (docs/architecture.md).

`steps` holds the step types and statuses, `assembly` puts an answer together from events, `writer` runs a
step's lifecycle, `relay` streams through it, `recovery` settles steps a dead process left open, `reader` serves
the read side (listings, Idempotency-Key look-ups) and `replay` rebuilds answers from what a step stored.
"""
