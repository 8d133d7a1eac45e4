"""The fakes' prompt caching (tests/support/prompt_cache.py): OpenAI's block prefixes, Anthropic's breakpoints."""

from __future__ import annotations

from tests.support.prompt_cache import (
    LOOKBACK_BLOCKS,
    Block,
    BreakpointCache,
    CacheUsage,
    PrefixCache,
    cacheable_tokens,
)


def test_cacheable_tokens_are_the_first_1024_then_steps_of_128() -> None:
    assert [cacheable_tokens(n) for n in (0, 1023, 1024, 1151, 1152, 5000)] == [0, 0, 1024, 1024, 1152, 4992]


def test_a_first_request_is_not_cached_and_a_repeat_is_up_to_its_last_whole_block() -> None:
    cache = PrefixCache()
    prompt = list(range(3000))
    assert cache.serve("m", prompt) == 0
    assert cache.serve("m", prompt) == cacheable_tokens(3000) == 2944


def test_a_prompt_that_grows_at_its_end_reads_the_earlier_prompt_s_blocks() -> None:
    cache = PrefixCache()
    cache.serve("m", list(range(2000)))
    assert cache.serve("m", list(range(2500))) == cacheable_tokens(2000)


def test_a_change_early_in_the_prompt_breaks_the_prefix_from_its_block_on() -> None:
    cache = PrefixCache()
    cache.serve("m", list(range(4000)))
    changed = list(range(4000))
    changed[1500] = -1
    assert cache.serve("m", changed) == 1408  # the blocks that end at 1,152, 1,280 and 1,408 still match
    changed[10] = -1
    assert cache.serve("m", changed) == 0


def test_short_prompts_and_other_scopes_share_nothing() -> None:
    cache = PrefixCache()
    cache.serve("m", list(range(1000)))
    assert cache.serve("m", list(range(1000))) == 0
    cache.serve("a", list(range(2000)))
    assert cache.serve("b", list(range(2000))) == 0
    cache.clear()
    assert cache.serve("a", list(range(2000))) == 0


def test_the_cached_prefix_is_scaled_to_the_reported_count_in_whole_blocks() -> None:
    cache = PrefixCache()
    cache.serve("m", list(range(4000)))
    assert cache.serve("m", list(range(4000)), reported=2000) == cacheable_tokens(round(3968 * 2000 / 4000))


def blocks(*sizes: int, marks: tuple[int, ...] = (), names: str = "") -> list[Block]:
    return [Block(f"{names}{index}", size, index in marks) for index, size in enumerate(sizes)]


def test_no_breakpoint_reads_and_writes_nothing() -> None:
    cache = BreakpointCache()
    assert cache.serve("m", blocks(5000)) == CacheUsage(0, 0)
    assert cache.serve("m", blocks(5000)) == CacheUsage(0, 0)


def test_a_breakpoint_writes_its_prefix_and_a_later_request_reads_it() -> None:
    cache = BreakpointCache()
    assert cache.serve("m", blocks(2000, 500, marks=(0,))) == CacheUsage(0, 2000)
    assert cache.serve("m", blocks(2000, 500, 300, marks=(0, 2))) == CacheUsage(2000, 800)
    assert cache.serve("m", blocks(2000, 500, 300, 100, marks=(0, 3))) == CacheUsage(2800, 100)


def test_a_changed_block_before_a_written_prefix_misses_it() -> None:
    cache = BreakpointCache()
    cache.serve("m", blocks(2000, 500, marks=(1,)))
    assert cache.serve("m", blocks(2000, 500, marks=(1,), names="x")) == CacheUsage(0, 2500)


def test_lookback_finds_a_written_prefix_at_most_20_blocks_before_a_breakpoint() -> None:
    cache = BreakpointCache()
    cache.serve("m", blocks(2000, marks=(0,)))
    near = blocks(2000, *[10] * LOOKBACK_BLOCKS, marks=(LOOKBACK_BLOCKS,))
    assert cache.serve("m", near) == CacheUsage(2000, 10 * LOOKBACK_BLOCKS)
    cache = BreakpointCache()
    cache.serve("m", blocks(2000, marks=(0,)))
    far = blocks(2000, *[10] * (LOOKBACK_BLOCKS + 1), marks=(LOOKBACK_BLOCKS + 1,))
    assert cache.serve("m", far) == CacheUsage(0, 2000 + 10 * (LOOKBACK_BLOCKS + 1))


def test_a_prefix_under_the_minimum_is_not_cached() -> None:
    cache = BreakpointCache()
    assert cache.serve("m", blocks(500, marks=(0,))) == CacheUsage(0, 0)
    assert cache.serve("m", blocks(500, marks=(0,))) == CacheUsage(0, 0)
