"""The doors: one per client API (OpenAI chat completions, OpenAI Responses, Anthropic Messages), each adapting
its API to the canonical form and back through one mechanism (`proxy.doors.door`). What every door shares: a
bounded body read (`body`), the X-Context-* headers (`context_headers`), SSE (`sse`, `event_streams`).
A new door is one module (or folder) here and one entry in `proxy.doors.registry.DOORS`.
"""
