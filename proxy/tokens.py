"""Token counting with tiktoken, offline, following OpenAI's chat accounting.

The proxy's own count is what invariant 2 is judged by (docs/architecture.md), so it must be deterministic and
cheap: counts are taken once per stored message (the history caches them per encoding) and never through
LiteLLM's `token_counter`, which rewrites `TIKTOKEN_CACHE_DIR` and may try to download Hugging Face tokenizers.
tiktoken finds its files offline because startup ran `proxy.environment.prepare()`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import orjson
import tiktoken

DEFAULT_ENCODING = "cl100k_base"
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING_TOKENS = 3
"""Every reply is primed with `<|start|>assistant<|message|>`: counted once per request."""

IMAGE_PART_TOKENS = 765
"""What a high-detail 512px tile image costs at OpenAI; images are not sent to us as pixels we could measure."""
FILE_PAGE_TOKENS = 1_500
"""What one page of a file part (a PDF) costs: Anthropic and OpenAI read each page as its text and an image."""
FILE_PAGE_BYTES = 50_000
"""About one PDF page, to estimate the pages of a file sent inline; a file sent by id counts as one page."""
TOKENS_PER_TOOL = 8
"""A function's framing in the provider's rendering of the tool list (its name line, its parameters' braces)."""
TOOLS_OVERHEAD = 12
"""The tool list's own framing (OpenAI's `namespace functions`, Anthropic's tool-use preamble is larger and is
left to the safety margin and the learned ratio)."""

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


def load_encoding(name: str) -> None:
    """Read `name`'s tables now, at startup, rather than in the first request that counts with it (up to ~0.3 s
    with the event loop stopped, when the file is not in the page cache)."""
    _encoding(name)


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
        tokens += sum(_media_tokens(part) for part in content if isinstance(part, Mapping))
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


def count_definitions(params: Mapping[str, Any], encoding: str = DEFAULT_ENCODING) -> int:
    """Tokens a request sends besides its messages: its tool definitions and its structured-output schema.

    Providers render them into the prompt (OpenAI as a TypeScript-like namespace, Anthropic as JSON in a system
    preamble), so they count against the window like messages; an agent's are often larger than its system
    prompt. Counted as name, description and the JSON schema's text, which is close to both renderings. An agent
    sends the same definitions with every request: the count is remembered by their text."""
    tools = params.get("tools")
    functions = (
        [tool["function"] for tool in tools if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping)]
        if isinstance(tools, list)
        else []
    )
    response_format = params.get("response_format")
    schema = response_format.get("json_schema") if isinstance(response_format, Mapping) else None
    if not functions and not isinstance(schema, Mapping):
        return 0
    try:
        text: bytes | str = orjson.dumps([functions, schema], option=orjson.OPT_SORT_KEYS, default=str)
    except TypeError:  # an integer past 64 bits
        text = json.dumps([functions, schema], ensure_ascii=False, sort_keys=True, default=str)
    return _definitions_tokens(text, encoding, bool(tools))


@lru_cache(maxsize=64)
def _definitions_tokens(text: bytes | str, encoding: str, listed: bool) -> int:
    """`count_definitions` of `text` (`[functions, schema]` as JSON); `listed`: the request has a tool list."""
    functions, schema = json.loads(text)
    total = TOOLS_OVERHEAD if listed else 0
    for function in functions:
        total += TOKENS_PER_TOOL + _definition_tokens(function, "parameters", encoding)
    if isinstance(schema, dict):
        total += TOKENS_PER_TOOL + _definition_tokens(schema, "schema", encoding)
    return total


def _definition_tokens(definition: Mapping[str, Any], schema_key: str, encoding: str) -> int:
    texts = [str(definition.get("name") or ""), str(definition.get("description") or "")]
    schema = definition.get(schema_key)
    if schema is not None:
        texts.append(json.dumps(schema, ensure_ascii=False, sort_keys=True))
    return sum(count_text(text, encoding) for text in texts if text)


def _media_tokens(part: Mapping[str, Any]) -> int:
    """The providers' per-item estimate for what is not text: an image, a file's pages."""
    kind = part.get("type")
    if kind in ("image_url", "input_image"):
        return IMAGE_PART_TOKENS
    if kind in ("file", "input_file"):
        file = part.get("file") if kind == "file" else part
        data = file.get("file_data") if isinstance(file, Mapping) else None
        size = len(data) * 3 // 4 if isinstance(data, str) else 0  # base64
        return FILE_PAGE_TOKENS * max(1, -(-size // FILE_PAGE_BYTES))
    return 0


def count_prompt(counts: Iterable[int]) -> int:
    """A prompt's total from its messages' counts."""
    return sum(counts) + REPLY_PRIMING_TOKENS


def _tool_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call for call in calls if isinstance(call, Mapping)]
