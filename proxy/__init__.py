"""Context Infinity: a streaming reverse proxy that gives any unmodified LLM tool an unbounded conversation."""
