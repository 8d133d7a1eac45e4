"""The client's 400 when a context cannot be compacted to fit: it blames what is really too large."""

from __future__ import annotations

from proxy.compaction.layout import RecentTooLarge
from proxy.compaction.refusals import too_large
from proxy.compaction.spans import CompactionRequest
from proxy.config.models import ModelEntry
from proxy.history.messages import StoredPath

ENTRY = ModelEntry("small", "openai/small", "http://127.0.0.1:9/v1", None, 4096, 512)


def request() -> CompactionRequest:
    return CompactionRequest("t", "s", [], StoredPath([]), ENTRY, "o200k_base", budget=3379, preserve_recent=4)


def test_recent_messages_over_the_budget_are_named_with_what_they_need() -> None:
    refused = too_large(RecentTooLarge(needed=5000, budget=3379, recent=5000), request())

    assert refused.message.startswith("The system messages and the 4 most recent messages need 5000 tokens")
    assert "is 3379 tokens" in refused.message


def test_summaries_that_shrink_no_further_are_named_not_the_recent_messages() -> None:
    """The fidelity bench's refusals said the recent messages needed 3,393 tokens when they needed ~200."""
    refused = too_large(RecentTooLarge(needed=3393, budget=3379, recent=200), request())

    assert "need 200 tokens" in refused.message
    assert "compacted as far as they go, 3193 more" in refused.message
    assert "(3379 tokens)" in refused.message
