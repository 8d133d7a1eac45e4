"""Which upstream refusals say "the prompt does not fit my context window", and the counts they report.

The pipeline heals such a refusal once (compact harder, call again) and the budget learns from it, but every
provider says it differently: OpenAI and Azure with a code, llama.cpp with a type and two number fields, the
rest only in a sentence, and LiteLLM by raising its `ContextWindowExceededError` for the wordings it knows. A
refusal is recognized by any of these; the wordings below also give the upstream's own counts (its prompt
tokens, its window), which tell how much more its tokenizer counts than ours and whether its real window is
smaller than the configured one. Pure: no LiteLLM import (its class is matched by name), no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from proxy.errors import CONTEXT_LENGTH_EXCEEDED, ContextOverflow

CONTEXT_ERROR_STATUSES = frozenset({400, 413, 422})
"""Statuses a context-window refusal comes with. A 429 "Request too large … tokens per min" is a rate limit."""
CONTEXT_ERROR_CODES = frozenset({CONTEXT_LENGTH_EXCEEDED})
"""OpenAI's and Azure's code (and that of the gateways and servers that copy their errors)."""
CONTEXT_ERROR_TYPES = frozenset({"exceed_context_size_error"})
"""llama.cpp's server (it adds `n_prompt_tokens` and `n_ctx` beside it)."""
LITELLM_CONTEXT_ERROR = "ContextWindowExceededError"
"""LiteLLM's class for the wordings it maps, matched by name so that this module never imports LiteLLM."""
LLAMA_CPP_PROMPT_FIELD, LLAMA_CPP_WINDOW_FIELD = "n_prompt_tokens", "n_ctx"

_N = r"(\d[\d,]*)"


def _wording(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace("{N}", _N), re.IGNORECASE)


WINDOW_WORDINGS = tuple(
    _wording(pattern)
    for pattern in (
        r"maximum context length is {N} tokens",  # OpenAI, Azure, DeepSeek, vLLM, OpenRouter
        r"configured limit of {N} tokens",  # OpenAI (gpt-5): "Input tokens exceed the configured limit of …"
        r"tokens > {N} maximum",  # Anthropic: "prompt is too long: 208310 tokens > 200000 maximum"
        r"exceed context limit: \d[\d,]* \+ \d[\d,]* > {N}",  # Anthropic, input + max_tokens
        r"available context size \({N} tokens\)",  # llama.cpp
        r"maximum model length of {N}",  # vLLM: "The decoder prompt (length N) is longer than …"
        r"maximum context length \({N} tokens\)",  # Ollama's newer runner
        r"maximum number of tokens allowed \({N}\)",  # Gemini
        r"model with {N} maximum context length",  # Mistral
        r"model's context length \({N} tokens\)",  # SGLang
        r"`max_new_tokens` must be <= {N}",  # Hugging Face TGI
        r"while limit is {N}",  # Cerebras
    )
)
"""Sentences that name the upstream's window; each also recognizes a refusal on its own."""

PROMPT_WORDINGS = tuple(
    _wording(pattern)
    for pattern in (
        r"\({N} in the messages",  # OpenAI (older), vLLM (older), DeepSeek
        r"\({N} in your prompt",  # OpenAI (older)
        r"messages resulted in {N} tokens",  # OpenAI, Azure
        r"request has {N} input tokens",  # vLLM
        r"prompt contains at least {N} input tokens",  # vLLM (newer)
        r"\({N} of text input",  # OpenRouter
        r"prompt is too long: {N} tokens",  # Anthropic
        r"exceed context limit: {N} \+",  # Anthropic, input + max_tokens
        r"request \({N} tokens\) exceeds",  # llama.cpp
        r"prompt \(length {N}\) is longer",  # vLLM
        r"input length \({N} tokens\) exceeds",  # Ollama's newer runner
        r"input token count \({N}\) exceeds",  # Gemini
        r"prompt contains {N} tokens",  # Mistral
        r"input \({N} tokens\) is longer",  # SGLang
        r"given: {N} `inputs` tokens",  # Hugging Face TGI
        r"current length is {N}",  # Cerebras
    )
)
"""Sentences that give the prompt as the upstream counted it; each also recognizes a refusal on its own."""

COUNTLESS_WORDINGS = tuple(
    _wording(pattern)
    for pattern in (
        r"exceeds the available context size",  # llama.cpp (older, without the counts)
        r"prompt is longer than the context length",  # Ollama
        r"input length exceeds the context length",  # Ollama
        r"exceeds the context window",  # OpenAI (Responses): "Your input exceeds the context window of this model"
        r"prompt is too long",  # Anthropic, Bedrock
        r"input is too long for requested model",  # Bedrock
    )
)
"""Sentences that recognize a refusal but give no count."""


def context_overflow(
    status: int, error: Mapping[str, Any] | None, message: str, exception: BaseException | None = None
) -> ContextOverflow | None:
    """The overflow an upstream refusal reports, or None when it is about something else.

    `error` is the upstream's JSON error object when there is one, `message` its text, `exception` the foreign
    exception it arrived as (LiteLLM's class says it has recognized the wording itself).
    """
    if status not in CONTEXT_ERROR_STATUSES:
        return None
    fields = error or {}
    reported = reported_counts(message)
    coded = str(fields.get("code")) in CONTEXT_ERROR_CODES or str(fields.get("type")) in CONTEXT_ERROR_TYPES
    recognized = reported is not None or coded or (exception is not None and _is_litellm_context_error(exception))
    if not recognized:
        return None
    reported = reported or ContextOverflow()
    return ContextOverflow(
        prompt_tokens=_count(fields.get(LLAMA_CPP_PROMPT_FIELD)) or reported.prompt_tokens,
        context_window=_count(fields.get(LLAMA_CPP_WINDOW_FIELD)) or reported.context_window,
        wording=reported.wording,
        coded=coded,
    )


def reported_counts(message: str) -> ContextOverflow | None:
    """The counts a context-window refusal's sentence reports (either may be None), with the sentences they were
    read from, or None when the sentence is not a context-window refusal in any wording known here."""
    window, window_text = _first(WINDOW_WORDINGS, message)
    prompt, prompt_text = _first(PROMPT_WORDINGS, message)
    wording = tuple(text for text in (window_text, prompt_text) if text)
    if not wording:
        wording = tuple(match.group(0) for w in COUNTLESS_WORDINGS if (match := w.search(message)) is not None)[:1]
        if not wording:
            return None
    return ContextOverflow(prompt_tokens=prompt, context_window=window, wording=wording)


def unquoted(overflow: ContextOverflow, sent: Iterable[Any]) -> ContextOverflow | None:
    """The overflow as far as the upstream said it in its own words, not the client's.

    Upstreams quote the request in their errors (OpenAI's `Invalid value: '…'`, vLLM's `input_value=…`), so a
    client can make one "say" any context-window sentence; learned from, it would shrink every tenant's budget. A
    wording that occurs in the strings of what was `sent` (messages, parameters) is not the upstream's: without it
    the refusal is countless when a field of the error object marked it (`coded`), and no overflow at all
    otherwise. Only called for a refusal, whose context fits the budget: the walk is short.
    """
    if not overflow.wording:
        return overflow
    wordings = [text.lower() for text in overflow.wording]
    if not any(wording in text for text in _lowered_strings(sent) for wording in wordings):
        return overflow
    return ContextOverflow(coded=True) if overflow.coded else None


def _lowered_strings(values: Iterable[Any]) -> Iterator[str]:
    pending: list[Any] = list(values)
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            yield value.lower()
        elif isinstance(value, Mapping):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)


def _first(wordings: tuple[re.Pattern[str], ...], message: str) -> tuple[int | None, str]:
    for wording in wordings:
        match = wording.search(message)
        if match is not None:
            return int(match.group(1).replace(",", "")), match.group(0)
    return None, ""


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _is_litellm_context_error(exception: BaseException) -> bool:
    return any(cls.__name__ == LITELLM_CONTEXT_ERROR for cls in type(exception).__mro__)
