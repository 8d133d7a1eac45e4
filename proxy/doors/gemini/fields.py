"""A Gemini request's fields as chat fields (pure).

Fields for a chat upstream, from `generationConfig`: `maxOutputTokens` → `max_tokens` (reserved from the
budget), `temperature`, `topP` → `top_p`, `stopSequences` → `stop`, `candidateCount` → `n`, `seed`,
`presencePenalty`, `frequencyPenalty`, `responseMimeType: application/json` → `response_format` (with
`responseJsonSchema` / `responseSchema` as its schema); `tools[].functionDeclarations` → functions (a Gemini
`Schema`'s upper-case types made JSON Schema's), `toolConfig.functionCallingConfig` → `tool_choice`. Gemini's own
(`topK`, `thinkingConfig`, `safetySettings`, `cachedContent`, hosted tools) stay behind for a chat upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import InvalidRequest, json_type

_NUMBER_FIELDS = {"temperature": "temperature", "topP": "top_p", "presencePenalty": "presence_penalty"}
_NUMBER_FIELDS |= {"frequencyPenalty": "frequency_penalty"}
_INTEGER_FIELDS = {"maxOutputTokens": ("max_tokens", 1), "candidateCount": ("n", 1), "seed": ("seed", None)}
_CHOICES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}


def generation_config(body: Mapping[str, Any]) -> Mapping[str, Any]:
    config = body.get("generationConfig", body.get("generation_config"))
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise InvalidRequest(
            f"Invalid value at 'generation_config': expected an object, got {json_type(config)}",
            param="generationConfig",
        )
    return config


def generation_params(config: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat fields a Gemini request's `generationConfig`, tools and tool config stand for."""
    params: dict[str, Any] = {}
    for name, chat in _NUMBER_FIELDS.items():
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(
                f"Invalid value at 'generation_config.{name}': expected a number", param=f"generationConfig.{name}"
            )
        params[chat] = value
    for name, (chat, minimum) in _INTEGER_FIELDS.items():
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
            shown = "an integer" if minimum is None else f"an integer of at least {minimum}"
            raise InvalidRequest(
                f"Invalid value at 'generation_config.{name}': expected {shown}", param=f"generationConfig.{name}"
            )
        params[chat] = value
    stop = config.get("stopSequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
            raise InvalidRequest(
                "Invalid value at 'generation_config.stop_sequences': expected strings",
                param="generationConfig.stopSequences",
            )
        if stop:
            params["stop"] = stop
    response_format = _response_format(config)
    if response_format is not None:
        params["response_format"] = response_format
    functions = _functions(body.get("tools"))
    if functions:
        params["tools"] = functions
        choice = _tool_choice(body.get("toolConfig", body.get("tool_config")))
        if choice is not None:
            params["tool_choice"] = choice
    return params


def _response_format(config: Mapping[str, Any]) -> dict[str, Any] | None:
    if config.get("responseMimeType") != "application/json":
        return None
    schema = config.get("responseJsonSchema", config.get("responseSchema"))
    if not isinstance(schema, dict):
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": json_schema(schema)}}


def _functions(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise InvalidRequest("Invalid value at 'tools': expected a list of Tool objects", param="tools")
    functions: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        declarations = tool.get("functionDeclarations", tool.get("function_declarations")) or []
        if not isinstance(declarations, list):
            raise InvalidRequest(
                f"Invalid value at 'tools[{index}].function_declarations': expected a list",
                param=f"tools[{index}].functionDeclarations",
            )
        for position, declaration in enumerate(declarations):
            functions.append(_function(declaration, f"tools[{index}].function_declarations[{position}]"))
    return functions


def _function(declaration: Any, where: str) -> dict[str, Any]:
    name = declaration.get("name") if isinstance(declaration, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"* GenerateContentRequest.{where}.name: Name cannot be empty.", param=f"{where}.name")
    schema = declaration.get("parametersJsonSchema")
    if not isinstance(schema, dict):
        schema = declaration.get("parameters")
        schema = json_schema(schema) if isinstance(schema, dict) else {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if isinstance(declaration.get("description"), str) and declaration["description"]:
        function["description"] = declaration["description"]
    return {"type": "function", "function": function}


def json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A Gemini `Schema` (OpenAPI's subset, types in upper case: `OBJECT`, `STRING`) as JSON Schema."""
    converted: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            converted["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            converted["properties"] = {
                name: json_schema(sub) if isinstance(sub, dict) else sub for name, sub in value.items()
            }
        elif key == "items" and isinstance(value, dict):
            converted["items"] = json_schema(value)
        elif key == "anyOf" and isinstance(value, list):
            converted["anyOf"] = [json_schema(sub) if isinstance(sub, dict) else sub for sub in value]
        elif key not in ("nullable", "propertyOrdering"):
            converted[key] = value
    if schema.get("nullable") is True and isinstance(converted.get("type"), str):
        converted["type"] = [converted["type"], "null"]
    return converted


def _tool_choice(config: Any) -> Any:
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    if not isinstance(calling, dict):
        return None
    choice = _CHOICES.get(str(calling.get("mode", "")).upper())
    allowed = calling.get("allowedFunctionNames")
    if choice == "required" and isinstance(allowed, list) and len(allowed) == 1 and isinstance(allowed[0], str):
        return {"type": "function", "function": {"name": allowed[0]}}
    return choice
