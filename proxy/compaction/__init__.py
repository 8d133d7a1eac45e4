"""Compaction: deciding what of a long conversation goes upstream verbatim, stubbed, summarized or omitted.

`builder` is the pure decision over `layout`'s data (which messages, which spans, what to write next), asking
the `strategies` in order; `summary_text`, `extractive` and `stubs` are the texts (the summarizer's prompt,
the deterministic fallback summary, tool-output stubs and omission markers): none does I/O. `compactor` is the
stage itself: it runs the builder, has `spans` write what it asks for (through `summarizer`, into
`summaries`, reported as `events`), recalls archived passages (`recall`) and pre-compacts in the background.
Each strategy is described in `strategies`.
"""
