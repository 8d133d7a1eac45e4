"""Prompt caching as the providers report it, for the strict fakes, so tests and benches can measure cached shares.

- `PrefixCache`: OpenAI's automatic prefix caching (chat completions and Responses). A prompt of 1,024 tokens or
  more is cached in blocks: the first 1,024 tokens, then every further 128; a request is served from the cache
  for the longest such block prefix that an earlier request of the same model and key sent. Reported as
  `prompt_tokens_details.cached_tokens` (Responses: `input_tokens_details.cached_tokens`), 0 below 1,024.
- `BreakpointCache`: Anthropic's caching, driven by `cache_control` breakpoints. The prompt is a list of blocks in
  cache order (tools, system, messages); a breakpoint writes the prefix that ends at its block; a later request
  reads the longest prefix it finds at its breakpoints or up to `LOOKBACK_BLOCKS` blocks before each; what lies
  between the read prefix and the last breakpoint is written (`cache_creation_input_tokens`), the rest is
  `input_tokens`. A prefix shorter than `MIN_CACHEABLE_TOKENS` is neither written nor read.

Both key prefixes by a running hash, so a cache of a long session is a set of digests, not of prompts.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

FIRST_BLOCK_TOKENS = 1024
"""OpenAI caches nothing shorter; the first cached block."""
BLOCK_TOKENS = 128
"""OpenAI's cache grows past the first block in steps of this many tokens."""
LOOKBACK_BLOCKS = 20
"""Anthropic checks for a hit at a breakpoint's block and at most this many blocks before it."""
MIN_CACHEABLE_TOKENS = 1024
"""Anthropic's least cacheable prefix (Claude Sonnet and Opus; Haiku's is larger)."""


def cacheable_tokens(tokens: int) -> int:
    """The longest OpenAI cache block prefix within `tokens`: 0 under 1,024, else 1,024 + a multiple of 128."""
    if tokens < FIRST_BLOCK_TOKENS:
        return 0
    return FIRST_BLOCK_TOKENS + (tokens - FIRST_BLOCK_TOKENS) // BLOCK_TOKENS * BLOCK_TOKENS


def _digest(previous: bytes, piece: bytes) -> bytes:
    return hashlib.blake2b(previous + piece, digest_size=16).digest()


class PrefixCache:
    """OpenAI-style automatic prefix caching over a prompt's tokens, shared by the requests of one scope."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def serve(self, scope: str, tokens: Sequence[int], reported: int | None = None) -> int:
        """The cached tokens of a prompt whose tokens are `tokens`, remembering its blocks for later requests.

        `reported` is the prompt's size as the fake reports it (its own count, which may render the prompt a little
        differently from `tokens`): the cached prefix is scaled to it and rounded down to whole blocks again."""
        state = _digest(b"", scope.encode())
        boundaries = range(FIRST_BLOCK_TOKENS, len(tokens) + 1, BLOCK_TOKENS)
        digests: list[tuple[int, bytes]] = []
        start = 0
        for end in boundaries:
            state = _digest(state, array("q", tokens[start:end]).tobytes())
            digests.append((end, state))
            start = end
        hit = 0
        with self._lock:
            for end, digest in digests:
                if digest not in self._seen:
                    break
                hit = end
            self._seen.update(digest for _end, digest in digests)
        if reported is None or not tokens:
            return hit
        return min(cacheable_tokens(round(hit * reported / len(tokens))), cacheable_tokens(reported))


@dataclass(frozen=True)
class Block:
    """One cacheable unit of an Anthropic prompt in cache order: a tool, a system block, a content block."""

    key: str
    """What the block says (its JSON), which a prefix's digest covers."""
    tokens: int
    breakpoint: bool
    """It carries `cache_control`."""


@dataclass(frozen=True)
class CacheUsage:
    read: int
    """`cache_read_input_tokens`."""
    creation: int
    """`cache_creation_input_tokens`."""


class BreakpointCache:
    """Anthropic-style caching at `cache_control` breakpoints, shared by the requests of one scope."""

    def __init__(self) -> None:
        self._written: set[bytes] = set()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._written.clear()

    def serve(self, scope: str, blocks: Sequence[Block]) -> CacheUsage:
        breakpoints = [index for index, block in enumerate(blocks) if block.breakpoint]
        if not breakpoints:
            return CacheUsage(0, 0)
        state = _digest(b"", scope.encode())
        prefixes: list[tuple[bytes, int]] = []
        tokens = 0
        for block in blocks[: breakpoints[-1] + 1]:
            state = _digest(state, block.key.encode() + b"\x00")
            tokens += block.tokens
            prefixes.append((state, tokens))
        with self._lock:
            read = 0
            for point in breakpoints:
                for index in range(point, max(-1, point - LOOKBACK_BLOCKS - 1), -1):
                    digest, size = prefixes[index]
                    if size >= MIN_CACHEABLE_TOKENS and digest in self._written:
                        read = max(read, size)
                        break
            for point in breakpoints:
                digest, size = prefixes[point]
                if size >= MIN_CACHEABLE_TOKENS:
                    self._written.add(digest)
        last = prefixes[breakpoints[-1]][1]
        creation = last - read if last >= MIN_CACHEABLE_TOKENS else 0
        return CacheUsage(read, creation)
