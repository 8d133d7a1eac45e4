"""How each provider refuses a prompt over its context window, for the fake upstream (`FakeUpstream.context_dialect`).

The proxy must recognize these refusals whatever their words, so the fake can answer in each provider's own
shape: status, error object and sentence as the real servers send them (read from their sources and from
captured answers). Each dialect also applies its own rule for what counts against the window — llama.cpp and
Ollama check the prompt alone, the others the prompt and the requested output — and returns None when the
request fits. OpenAI's own wording is the fake's default (`fake_upstream._check_context_window`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Refusal = tuple[int, dict[str, Any]]
"""(status, JSON body) of a refusal."""
ContextDialect = Callable[[int, int, int], Refusal | None]
"""(prompt tokens as the upstream counts them, requested output or 0, window) → the refusal, or None if it fits."""

OLLAMA_MESSAGE = (
    "the prompt is longer than the context length currently available to the model; shorten the prompt, adjust "
    "the context length in settings, or use a model with a longer context length"
)


def llama_cpp(prompt: int, output: int, window: int) -> Refusal | None:
    """llama.cpp's server (`exceed_context_size_error`, with the two counts beside the sentence)."""
    if prompt <= window:
        return None
    message = f"request ({prompt} tokens) exceeds the available context size ({window} tokens), try increasing it"
    error = {
        "code": 400,
        "message": message,
        "type": "exceed_context_size_error",
        "n_prompt_tokens": prompt,
        "n_ctx": window,
    }
    return 400, {"error": error}


def anthropic(prompt: int, output: int, window: int) -> Refusal | None:
    """Anthropic, as its OpenAI-compatible endpoint (or a gateway in front of it) answers: no code, one sentence."""
    if prompt > window:
        message = f"prompt is too long: {prompt} tokens > {window} maximum"
    elif prompt + output > window:
        message = (
            f"input length and `max_tokens` exceed context limit: {prompt} + {output} > {window}, decrease input "
            "length or `max_tokens` and try again"
        )
    else:
        return None
    return 400, {"error": {"type": "invalid_request_error", "message": message}}


def vllm(prompt: int, output: int, window: int) -> Refusal | None:
    """vLLM before 0.10: the total requested, split into messages and completion."""
    if prompt + output <= window:
        return None
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested {prompt + output} tokens "
        f"({prompt} in the messages, {output} in the completion). Please reduce the length of the messages or "
        "completion."
    )
    return 400, _vllm_error(message, None)


def vllm_current(prompt: int, output: int, window: int) -> Refusal | None:
    """vLLM today: the prompt alone, or the prompt with the requested output."""
    if prompt > window:
        message = (
            f"This model's maximum context length is {window} tokens. However, your request has {prompt} input "
            "tokens. Please reduce the length of the input messages."
        )
    elif prompt + output > window:
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested {output} output "
            f"tokens and your prompt contains at least {prompt} input tokens, for a total of at least "
            f"{prompt + output} tokens. Please reduce the length of the input prompt or the number of "
            f"requested output tokens. (parameter=input_tokens, value={prompt})"
        )
    else:
        return None
    return 400, _vllm_error(message, "input_tokens")


def ollama(prompt: int, output: int, window: int) -> Refusal | None:
    """Ollama's OpenAI-compatible endpoint: no count at all."""
    if prompt <= window:
        return None
    return 400, {"error": {"message": OLLAMA_MESSAGE, "type": "invalid_request_error", "param": None, "code": None}}


def _vllm_error(message: str, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


DIALECTS: dict[str, ContextDialect] = {
    "llama.cpp": llama_cpp,
    "anthropic": anthropic,
    "vllm": vllm,
    "vllm-current": vllm_current,
    "ollama": ollama,
}
