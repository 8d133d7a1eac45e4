"""Process environment that LiteLLM and tiktoken read, set before either is first used.

- Offline start: `import litellm` fetches a model-cost map and `tiktoken.get_encoding` downloads BPE files
  unless told otherwise; LiteLLM ships the two encodings we need, so tiktoken is pointed at them.
- Forwarding path: `EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER` sends `openai/` models through LiteLLM's httpx
  handler instead of the OpenAI SDK, which walks every message recursively (measured: 11 ms instead of 96 ms
  per call at 500 messages). It is read from the environment on every call, hence set here, once.

Only variables the operator has not set are filled in; calling `prepare()` again changes nothing. Nothing
happens at import: startup calls `prepare()` (the CLI before it serves, `open_services` before the store and
the upstream are built), and `litellm()` is the one place LiteLLM is imported and its globals are set.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import os
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER": "true",
    "HF_HUB_OFFLINE": "1",
    "LITELLM_LOG": "ERROR",
    # LiteLLM walks every message of every call to shorten base64 images in its own logging payloads, which
    # the proxy never reads: 0 turns the walk off.
    "MAX_BASE64_LENGTH_FOR_LOGGING": "0",
}


LAZY_TRANSPORT_MODULES = ("httpcore", "httpx._transports.default")


def litellm_tokenizer_dir() -> Path:
    """LiteLLM ships cl100k_base and o200k_base here, named as tiktoken's cache expects."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        raise RuntimeError("litellm is not installed")
    return Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"


def prepare() -> None:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(litellm_tokenizer_dir()))
    logging.getLogger("LiteLLM").setLevel(logging.ERROR)


def litellm() -> ModuleType:
    """LiteLLM, imported after `prepare()` and set up as the proxy needs it."""
    prepare()
    module = importlib.import_module("litellm")
    settings: Any = module
    settings.suppress_debug_info = True
    settings.disable_hf_tokenizer_download = True
    # LiteLLM's default aiohttp transport discards data it had already received when the connection breaks
    # before it is read (aiohttp's StreamReader raises its stored error first): chunks the upstream sent and we
    # were about to journal would be lost. httpx hands them over, then raises.
    settings.disable_aiohttp_transport = True
    # httpx imports its transport (httpcore, h2, hpack) when LiteLLM builds its first client, i.e. inside the first
    # upstream call, on the event loop: ~0.2 s every other client would wait. Imported here, at startup instead.
    for transport in LAZY_TRANSPORT_MODULES:
        importlib.import_module(transport)
    return module


async def close_loop_clients(module: ModuleType) -> int:
    """Close the HTTP clients LiteLLM cached for the running event loop; how many were cached.

    LiteLLM keys its client cache by event loop and closes a client only once it is evicted, on whatever loop
    evicts it: a process that serves on one loop and then another (a restart in place, every test's proxy)
    leaves the first loop's connections open until then. Called while the loop still runs, at shutdown.
    """
    cache: Any = getattr(module, "in_memory_llm_clients_cache", None)
    entries = getattr(cache, "cache_dict", None)
    if not isinstance(entries, dict):
        return 0
    suffix = f"-{id(asyncio.get_running_loop())}"
    keys = [key for key in list(entries) if isinstance(key, str) and key.endswith(suffix)]
    for key in keys:
        close = getattr(entries.get(key), "close", None)
        if close is not None and inspect.iscoroutinefunction(close):
            try:
                await close()
            except Exception as exc:  # a client already closed, or broken: shutdown goes on
                logging.getLogger(__name__).debug("closing a cached LiteLLM client failed: %s", exc)
        cache.delete_cache(key)
    return len(keys)
