"""Token counting with tiktoken, offline, following OpenAI's chat accounting.

The proxy's own count is what invariant 2 is judged by (docs/architecture.md), so it must be deterministic and
cheap: counts are taken once per stored message (the history caches them per encoding) and never through
LiteLLM's `token_counter`, which rewrites `TIKTOKEN_CACHE_DIR` and may try to download Hugging Face tokenizers.
tiktoken finds its files offline because startup ran `proxy.environment.prepare()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import tiktoken

DEFAULT_ENCODING = "cl100k_base"
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING_TOKENS = 3
"""Every reply is primed with `<|start|>assistant<|message|>`: counted once per request."""

IMAGE_PART_TOKENS = 765
"""What a high-detail 512px tile image costs at OpenAI; images are not sent to us as pixels we could measure."""

_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss")


def encoding_for_model(model: str) -> str:
    """The tiktoken encoding for a LiteLLM model string; cl100k_base for everything not known to use o200k."""
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    return DEFAULT_ENCODING


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name)


SEGMENT_CHARS = 64 * 1024
"""Longer texts are counted in segments of about this size: tiktoken needs ~50 bytes per character of the text it
encodes at once (a 30 MB text without spaces needed 1.5 GB), and a segment's cost stays fixed."""
_CUT_WINDOW = 4096


def count_text(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    """Exact up to `SEGMENT_CHARS`; beyond, the sum of segments cut before a space between two words (where
    tiktoken's own pre-tokenizer cuts too), so the count of ordinary text stays exact and its memory bounded."""
    codec = _encoding(encoding)
    # encode_ordinary: text containing "<|endoftext|>" is user data, not a special token (and would raise).
    if len(text) <= SEGMENT_CHARS:
        return len(codec.encode_ordinary(text))
    total, start = 0, 0
    while start < len(text):
        end = _segment_end(text, start)
        total += len(codec.encode_ordinary(text[start:end]))
        start = end
    return total


def _segment_end(text: str, start: int) -> int:
    end = start + SEGMENT_CHARS
    if end >= len(text):
        return len(text)
    floor = end - _CUT_WINDOW
    cut = text.rfind(" ", floor, end)
    while cut > floor:
        if not text[cut - 1].isspace() and not text[cut + 1].isspace():
            return cut
        cut = text.rfind(" ", floor, cut)
    return end  # no word boundary near: a cut inside a word miscounts it by a token or two


def rough_size(message: Mapping[str, Any]) -> int:
    """About how many characters of text a message holds (content, tool call arguments), without walking it: what
    decides whether the work on it is worth a thread (`proxy.offload`)."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else len(content_text(content))
    for call in _tool_calls(message):
        function = call.get("function")
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        size += len(arguments) if isinstance(arguments, str) else 0
    return size


def content_text(content: Any, separator: str = "") -> str:
    """The text of a message's content: a string, or the text parts of a content-part list joined by
    `separator`. The one way the proxy reads a message's text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (str(part.get("text", "")) for part in content if isinstance(part, Mapping) and "text" in part)
        return separator.join(texts)
    return str(content)


def count_message(message: Mapping[str, Any], encoding: str = DEFAULT_ENCODING) -> int:
    """Tokens one message costs in a prompt, including OpenAI's per-message overhead and its tool calls."""
    texts = [str(message.get("role", "")), content_text(message.get("content"))]
    tokens = TOKENS_PER_MESSAGE
    content = message.get("content")
    if isinstance(content, list):
        tokens += IMAGE_PART_TOKENS * sum(
            1 for part in content if isinstance(part, Mapping) and part.get("type") in ("image_url", "input_image")
        )
    name = message.get("name")
    if isinstance(name, str):
        texts.append(name)
        tokens += TOKENS_PER_NAME
    tool_call_id = message.get("tool_call_id")
    if isinstance(tool_call_id, str):
        texts.append(tool_call_id)
    for call in _tool_calls(message):
        function = call.get("function") or {}
        texts.append(str(function.get("name", "")))
        texts.append(str(function.get("arguments", "")))
        tokens += TOKENS_PER_TOOL_CALL
    return tokens + sum(count_text(text, encoding) for text in texts if text)


def count_prompt(counts: Iterable[int]) -> int:
    """A prompt's total from its messages' counts."""
    return sum(counts) + REPLY_PRIMING_TOKENS


def _tool_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call for call in calls if isinstance(call, Mapping)]
