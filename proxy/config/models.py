"""The `models:` list: the models clients may ask for, each with the API its upstream speaks (`ModelEntry`), and
how the list is read and checked (`model_entries`). The other sections are `proxy.config.schema`'s."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config.sections import ConfigError, Section, read_fields, setting

CHAT_API = "chat"
RESPONSES_API = "responses"
MESSAGES_API = "messages"
UPSTREAM_APIS = (CHAT_API, RESPONSES_API, MESSAGES_API)
"""`models[].api` (compared without case): chat, any provider through LiteLLM, and the native APIs, each spoken by
the one client that declares it (`proxy.upstream.natives.NATIVE_CLIENTS`, which a test holds to this list)."""


@dataclass(frozen=True)
class ModelEntry:
    """One model clients may ask for: `name` is what they send, `model` the LiteLLM model string."""

    name: str
    model: str
    api_base: str | None = None
    api_key: str | None = setting(None, repr=False)
    context_window: int | None = setting(None, minimum=256)
    max_output: int | None = setting(None, minimum=1)
    api: str = setting(CHAT_API, choices=tuple(api.upper() for api in UPSTREAM_APIS))
    """What the upstream speaks natively: `chat` (chat completions through LiteLLM, any provider: every door
    reaches it), `responses` (OpenAI's Responses API itself, for the Responses door: input items, encrypted
    reasoning and ids reach it as the client sent them) or `messages` (Anthropic's Messages API itself, for the
    Messages door: blocks, thinking signatures and `cache_control` as sent). Other doors use chat."""


def model_entries(root: Section) -> tuple[ModelEntry, ...]:
    """`models:`, each entry read and checked: names distinct, the output smaller than the window."""
    raw = root.data.get("models", [])
    if not isinstance(raw, list):
        raise ConfigError("models: must be a list of model entries")
    entries: list[ModelEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        entry = read_fields(ModelEntry, Section(item, f"models[{index}]"))
        if entry.name in seen:
            raise ConfigError(f"models[{index}].name: {entry.name!r} is listed twice")
        if (
            entry.context_window is not None
            and entry.max_output is not None
            and entry.max_output >= entry.context_window
        ):
            raise ConfigError(f"models[{index}].max_output must be smaller than its context_window")
        seen.add(entry.name)
        entries.append(entry)
    return tuple(entries)
