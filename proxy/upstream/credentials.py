"""Provider keys a model needs and does not have: found once at startup, named again when a call then fails.

A newcomer's first trip: the example config reads `${OPENAI_API_KEY}`, nothing sets it, the proxy starts, and
the first request fails far from the cause (offline, as "could not be reached"; online, as a 401 the client
may take for its own proxy key). LiteLLM knows which variables each provider reads (`validate_environment`),
so the proxy asks it once per model entry, warns at startup, and adds the names to the error and log line of
a call that fails for want of them. It only warns: LiteLLM can find credentials elsewhere (AWS profiles, a
workload identity), so a model is never refused for this.

The same variables, when they are set, hold secrets the proxy sends upstream without its config naming them:
`redactor` reads their values once at startup, for the `Redactor` (`proxy.upstream.redaction`), so a provider
that echoes the key it refused does not carry it to a client, a log line or the journal. A native client's own
variables are its declaration (`proxy.upstream.natives`), not a second table here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from proxy import environment
from proxy.config.models import ModelEntry
from proxy.config.schema import Config
from proxy.upstream.natives import native_client
from proxy.upstream.redaction import Redactor

log = logging.getLogger(__name__)

OWN_SERVER_PROVIDERS = frozenset({"openai"})
"""With an `api_base`, an `openai/` model is an OpenAI-compatible server of the operator's own (vLLM, llama.cpp,
Ollama), which usually needs no key at all: LiteLLM's answer (OPENAI_API_KEY) does not apply."""


KEY_VARIABLES: dict[str, tuple[str, ...]] = {
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
    "azure": ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY", "AZURE_AD_TOKEN"),
    "bedrock": ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK"),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY", "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN"),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "huggingface": ("HUGGINGFACE_API_KEY", "HF_TOKEN"),
    "perplexity": ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"),
    "sagemaker": ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    "together_ai": ("TOGETHERAI_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHER_AI_TOKEN"),
}
"""The variables LiteLLM (1.106) reads a provider's key from, where they are more than `<PROVIDER>_API_KEY`."""


def key_variables(entry: ModelEntry, provider: str | None) -> tuple[str, ...]:
    """The environment variables a call to `entry` may take its key from (with no `api_key` in the entry): its
    provider's, as LiteLLM reads them, and those the proxy's own client of its native API (`models[].api`) reads."""
    names = KEY_VARIABLES.get(provider, (f"{provider.upper()}_API_KEY",)) if provider else ()
    native = native_client(entry.api)
    return names + (native.key_variables if native is not None else ())


def redactor(config: Config, environ: Mapping[str, str] | None = None) -> Redactor:
    """The `Redactor` of a config: its secrets, and the provider keys its models read from `environ` (the
    process's, now)."""
    found = {entry.api_key for entry in config.models if entry.api_key} | set(config.auth.keys)
    found |= set(config.auth.admin_keys)
    found |= set(environment_keys(config.models, os.environ if environ is None else environ))
    return Redactor.of(found)


def environment_keys(models: Iterable[ModelEntry], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the provider keys the models without an `api_key` read from `environ`; LiteLLM is asked for
    each one's provider (and for the key its provider lookup itself takes from the environment)."""
    keyless = [entry for entry in models if not entry.api_key]
    if not keyless:
        return ()
    litellm = environment.litellm()
    found: set[str] = set()
    for entry in keyless:
        provider, key = _provider(litellm, entry)
        found.update(environ[name] for name in key_variables(entry, provider) if environ.get(name))
        if key and key in environ.values():
            found.add(key)
    return tuple(sorted(found))


def _provider(litellm: Any, entry: ModelEntry) -> tuple[str | None, str | None]:
    """LiteLLM's provider for the entry and the key it found for it, or the model string's prefix."""
    try:
        _model, provider, key, _base = litellm.get_llm_provider(entry.model, api_base=entry.api_base)
    except Exception as exc:  # an unknown provider fails on the first call, in LiteLLM's words; not at startup
        log.debug("no LiteLLM provider for model %s: %s", entry.name, type(exc).__name__)
        prefix, slash, _rest = entry.model.partition("/")
        return (prefix if slash else None), None
    return str(provider), (key if isinstance(key, str) else None)


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
