"""A Responses request's tools and fields as a chat-completions upstream takes them.

Tools: `function` tools become chat functions; `custom` tools (free-form input, like Codex's apply_patch) become
functions with one string parameter `input`; tools of a `namespace` become functions named `namespace__name`;
hosted tools a chat model cannot run (web_search, tool_search, ...) are left out. `ToolNames` says how the
answer's tool calls map back (`proxy.doors.responses.output`). Fields: `max_output_tokens` → `max_tokens`,
`reasoning.effort` → `reasoning_effort`, `text.format` → `response_format`, the chat fields as sent, and any
field unknown to both APIs passed through; the rest is Responses' own and stays behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import InvalidRequest
from proxy.formats.responses_items import CUSTOM_INPUT, NAMESPACE_SEPARATOR

_CHAT_FIELDS = (
    "temperature",
    "top_p",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "seed",
    "store",
)
_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "model",
        "stream",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "reasoning",
        "text",
        "include",
        "store",
        "previous_response_id",
        "truncation",
        "metadata",
        "background",
        "client_metadata",
        "prompt",
        "conversation",
        "max_tool_calls",
        "top_logprobs",
        "stream_options",
        *_CHAT_FIELDS,
    }
)
"""Fields with a Responses meaning, mapped (or left out) for a chat upstream; any other field passes through."""


@dataclass(frozen=True)
class ToolNames:
    """How the chat function names the upstream sees map back to the client's tools."""

    custom: frozenset[str] = frozenset()
    """Functions that stand for custom tools: their calls go back as custom_tool_call items."""
    namespaced: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Function name → (namespace, tool name)."""


def chat_tools(tools: Any) -> tuple[list[dict[str, Any]], ToolNames]:
    """The request's tools as chat functions, and how their names map back."""
    if tools is None:
        return [], ToolNames()
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise InvalidRequest("Invalid type for 'tools': expected an array of objects.", param="tools")
    chat: list[dict[str, Any]] = []
    custom: set[str] = set()
    namespaced: dict[str, tuple[str, str]] = {}
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function":
            chat.append(_function(tool, _tool_name(tool, f"tools[{index}]")))
        elif kind == "custom":
            name = _tool_name(tool, f"tools[{index}]")
            custom.add(name)
            chat.append(_custom_function(tool, name))
        elif kind == "namespace":
            namespace = _tool_name(tool, f"tools[{index}]")
            for inner_index, inner in enumerate(tool.get("tools") or ()):
                if not isinstance(inner, dict):
                    continue
                name = f"{namespace}{NAMESPACE_SEPARATOR}{_tool_name(inner, f'tools[{index}].tools[{inner_index}]')}"
                namespaced[name] = (namespace, str(inner["name"]))
                if inner.get("type") == "custom":
                    custom.add(name)
                    chat.append(_custom_function(inner, name))
                else:
                    chat.append(_function(inner, name))
        # Hosted tools (web_search, file_search, tool_search, ...) are the provider's to run: a chat model has none.
    return chat, ToolNames(frozenset(custom), namespaced)


def _tool_name(tool: Mapping[str, Any], where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"Missing required parameter: '{where}.name'.", param=f"{where}.name")
    return name


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _custom_function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    description = str(tool.get("description") or "")
    grammar = tool.get("format")
    if isinstance(grammar, dict) and grammar.get("definition"):
        description += f"\n\nThe input follows this {grammar.get('syntax', '')} grammar:\n{grammar['definition']}"
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as free text."}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def chat_params(body: Mapping[str, Any], tools: list[dict[str, Any]], names: ToolNames, stream: bool) -> dict[str, Any]:
    """The chat request's fields besides model and messages."""
    params: dict[str, Any] = {key: body[key] for key in _CHAT_FIELDS if body.get(key) is not None}
    params.update({key: value for key, value in body.items() if key not in _RESPONSES_ONLY})
    if stream:
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}  # response.completed reports usage
    if body.get("max_output_tokens") is not None:
        params["max_tokens"] = body["max_output_tokens"]
    if tools:
        params["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), names)
        if choice is not None:
            params["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            params["parallel_tool_calls"] = body["parallel_tool_calls"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        params["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    response_format = _response_format(text.get("format")) if isinstance(text, dict) else None
    if response_format is not None:
        params["response_format"] = response_format
    return params


def _tool_choice(choice: Any, names: ToolNames) -> Any:
    if isinstance(choice, str):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") in ("function", "custom")
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None  # an allowed_tools or hosted-tool choice has no chat equivalent: the model chooses


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None
