"""Context Infinity: an OpenAI-compatible proxy that gives any OpenAI-SDK client an unbounded conversation."""
