"""Compaction: deciding what of a long conversation goes upstream verbatim and what as summaries.

`builder` is the pure decision (which messages, which summaries, what to summarize next) and `summary_text`
the summarizer's prompt, the deterministic fallback summary and tool-output reduction: neither does I/O.
`compactor` is the stage itself (it runs the builder, asks `summarizer` for summaries and stores them in
`summaries`). See docs/architecture.md, "Compaction".
"""
