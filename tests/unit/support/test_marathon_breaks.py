"""The marathon's count of prompt-cache breaks between two crossings takes the crossings from the proxy's journal:
a crossing that only stubs the last tool output can leave the prompt as long as before, and is still a
crossing, not a break no compaction explains."""

from __future__ import annotations

from bench.harness.marathon import MAIN_MODEL_ID, prefix_breaks, prompt_breaks
from tests.support.fake_upstream import Served


def served(prompt: int, cached: int) -> Served:
    return Served(model=MAIN_MODEL_ID, tools=1, prompt_tokens=prompt, cached_tokens=cached)


# a prompt extended, then one whose last tool output was stubbed (cached less, no shorter), then extended again
MAIN = [served(20_000, 0), served(22_000, 19_900), served(22_100, 17_000), served(24_000, 22_000)]


def test_a_break_where_the_proxy_crossed_is_explained() -> None:
    assert prefix_breaks(MAIN) == (1, 1), "without the journal: a break with no shorter prompt is unexplained"
    assert prefix_breaks(MAIN, [False, False, True, False]) == (1, 0)
    assert prefix_breaks(MAIN, [False, True, False, False]) == (1, 1), "the crossing was elsewhere"


def test_breaks_are_sorted_by_the_proxy_s_crossings() -> None:
    def body(*texts: str) -> dict[str, object]:
        return {"tools": [{"type": "function"}], "messages": [{"role": "user", "content": t} for t in texts]}

    bodies = [body("a"), body("a", "b"), body("a", "B", "c"), body("a", "B", "c", "d"), body("x")]
    assert prompt_breaks(bodies) == {"crossing": [4], "recall": [], "other": [2]}
    assert prompt_breaks(bodies, [False, False, True, False, True]) == {"crossing": [2, 4], "recall": [], "other": []}
