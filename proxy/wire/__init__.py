"""Wire adapters: one per client wire format, each parsing requests into the canonical conversation and rendering
answers and errors back in its own shape (docs/architecture.md). `body`, `sse` and `context_headers` are what
every door shares: a bounded body read, server-sent-event framing, and the X-Context-* headers.
"""
