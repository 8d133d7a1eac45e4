"""Provider keys a model needs and does not have: found once at startup, named again when a call then fails.

A newcomer's first trip: the example config reads `${OPENAI_API_KEY}`, nothing sets it, the proxy starts, and
the first request fails far from the cause (offline, as "could not be reached"; online, as a 401 the client
may take for its own proxy key). LiteLLM knows which variables each provider reads (`validate_environment`),
so the proxy asks it once per model entry, warns at startup, and adds the names to the error and log line of
a call that fails for want of them. It only warns: LiteLLM can find credentials elsewhere (AWS profiles, a
workload identity), so a model is never refused for this.
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.config import ModelEntry

log = logging.getLogger(__name__)

OWN_SERVER_PROVIDERS = frozenset({"openai"})
"""With an `api_base`, an `openai/` model is an OpenAI-compatible server of the operator's own (vLLM, llama.cpp,
Ollama), which usually needs no key at all: LiteLLM's answer (OPENAI_API_KEY) does not apply."""


def missing_keys(litellm: Any, entry: ModelEntry, provider: str) -> tuple[str, ...]:
    """The environment variables `entry` still needs (none when its config gives what they would), as LiteLLM
    knows them for `provider`."""
    if entry.api_base and provider in OWN_SERVER_PROVIDERS:
        return ()
    try:
        found = litellm.validate_environment(model=entry.model, api_key=entry.api_key or None, api_base=entry.api_base)
    except Exception as exc:  # a best-effort diagnosis must never stop the proxy from starting
        log.debug("could not check the keys of model %s: %s", entry.name, type(exc).__name__)
        return ()
    names = found.get("missing_keys") if isinstance(found, dict) else None
    return tuple(str(name) for name in names or ())


def missing_keys_text(entry: ModelEntry, names: tuple[str, ...]) -> str:
    """The one sentence that names what is missing, for the startup warning, the log line and the client."""
    variables = ", ".join(names)
    verb = "is" if len(names) == 1 else "are"
    return (
        f"No API key for model '{entry.name}' ({entry.model}): {variables} {verb} not set in the proxy's "
        "environment and its config entry has no api_key."
    )


def warn_missing_keys(entry: ModelEntry, names: tuple[str, ...]) -> None:
    """The startup warning, once per model."""
    if names:
        log.warning(
            "%s Its requests will fail until the key is set (or api_base points at a server that needs none).",
            missing_keys_text(entry, names),
        )
