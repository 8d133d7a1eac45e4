"""`proxy.doors.gemini.fields`: a Gemini request's generation config, tools and tool config as chat fields."""

from __future__ import annotations

import json
from typing import Any

from proxy.config.schema import RequestLimits
from proxy.doors.gemini.fields import json_schema
from proxy.doors.gemini.input import parse_generate_request

LIMITS = RequestLimits()


def parsed(body: dict[str, Any], *, stream: bool = False) -> Any:
    return parse_generate_request(json.dumps(body).encode(), "gemini-model", stream, LIMITS)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def test_generation_config_tools_and_tool_config_are_chat_fields() -> None:
    body = {
        "contents": [user("hi")],
        "generationConfig": {
            "maxOutputTokens": 300,
            "temperature": 0.2,
            "topP": 0.9,
            "topK": 40,
            "stopSequences": ["END"],
            "seed": 7,
            "responseMimeType": "application/json",
            "responseJsonSchema": {"type": "object"},
            "thinkingConfig": {"thinkingBudget": 0},
        },
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "weather",
                        "description": "The weather.",
                        "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING", "nullable": True}}},
                    },
                    {"name": "ls", "parametersJsonSchema": {"type": "object", "properties": {}}},
                ]
            },
            {"googleSearch": {}},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["ls"]}},
    }
    conversation = parsed(body, stream=True)
    params = conversation.params
    assert (conversation.max_output, conversation.max_output_param) == (300, "generationConfig.maxOutputTokens")
    assert {key: params[key] for key in ("max_tokens", "temperature", "top_p", "stop", "seed")} == {
        "max_tokens": 300,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
    }
    assert params["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert [tool["function"]["name"] for tool in params["tools"]] == ["weather", "ls"]
    assert params["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"city": {"type": ["string", "null"]}},
    }
    assert params["tool_choice"] == {"type": "function", "function": {"name": "ls"}}
    assert (params["stream"], params["stream_options"]) == (True, {"include_usage": True})
    assert "topK" not in json.dumps(params)


def test_a_gemini_schema_is_json_schema_all_the_way_down() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {"tags": {"type": "ARRAY", "items": {"type": "STRING"}}},
        "propertyOrdering": ["tags"],
        "anyOf": [{"type": "INTEGER"}],
    }
    assert json_schema(schema) == {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
        "anyOf": [{"type": "integer"}],
    }
