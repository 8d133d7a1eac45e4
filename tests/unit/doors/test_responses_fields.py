"""A Responses request's tools and fields for a chat upstream (`proxy.doors.responses.fields`): Codex's custom and
namespaced tools as chat functions (and how their names map back), hosted tools left out, and each field mapped,
passed through or kept behind."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.doors.responses.fields import ToolNames, chat_params, chat_tools
from proxy.errors import InvalidRequest

SHELL: dict[str, Any] = {
    "type": "function",
    "name": "shell",
    "description": "Runs a command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"command": {"type": "array"}}, "required": ["command"]},
}
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"},
}


def test_function_tools_become_chat_functions() -> None:
    tools, names = chat_tools([SHELL])
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "Runs a command.",
                "parameters": SHELL["parameters"],
                "strict": False,
            },
        }
    ]
    assert names == ToolNames()


def test_a_custom_tool_becomes_a_function_of_one_string_input_with_its_grammar_described() -> None:
    tools, names = chat_tools([APPLY_PATCH])
    [tool] = tools
    function = tool["function"]
    assert function["name"] == "apply_patch"
    assert function["parameters"] == {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's whole input, as free text."}},
        "required": ["input"],
        "additionalProperties": False,
    }
    assert function["description"].startswith("Edit files.")
    assert "lark grammar" in function["description"]
    assert function["description"].endswith("start: begin_patch hunk+ end_patch")
    assert names.custom == frozenset({"apply_patch"})


def test_a_custom_tool_without_a_grammar_keeps_its_description() -> None:
    [tool], _ = chat_tools([{"type": "custom", "name": "note"}])
    assert tool["function"]["description"] == ""


def test_namespaced_tools_are_namespace__name_and_map_back() -> None:
    namespace = {
        "type": "namespace",
        "name": "github",
        "description": "GitHub.",
        "tools": [
            {"type": "function", "name": "create_issue", "parameters": {"type": "object"}},
            {"type": "custom", "name": "comment"},
            "not a tool",
        ],
    }
    tools, names = chat_tools([namespace])
    assert [tool["function"]["name"] for tool in tools] == ["github__create_issue", "github__comment"]
    assert names.namespaced == {
        "github__create_issue": ("github", "create_issue"),
        "github__comment": ("github", "comment"),
    }
    assert names.custom == frozenset({"github__comment"})


def test_hosted_tools_are_left_out_for_a_chat_model() -> None:
    hosted = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "tool_search"}]
    tools, names = chat_tools([*hosted, SHELL])
    assert [tool["function"]["name"] for tool in tools] == ["shell"]
    assert names == ToolNames()
    assert chat_tools(None) == ([], ToolNames())


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function"}, "tools"),
        ([SHELL, "shell"], "tools"),
        ([SHELL, {"type": "function", "parameters": {}}], "tools[1].name"),
        ([{"type": "custom", "name": ""}], "tools[0].name"),
        ([{"type": "namespace", "tools": []}], "tools[0].name"),
    ],
)
def test_invalid_tools_are_refused_naming_the_param(tools: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_tools(tools)
    assert refused.value.param == param
    assert refused.value.status == 400


def test_an_unnamed_tool_inside_a_namespace_is_refused_naming_its_own_path() -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_tools([SHELL, {"type": "namespace", "name": "ns", "tools": [{"type": "function"}]}])
    assert refused.value.param == "tools[1].tools[0].name"


def params(body: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    tools, names = chat_tools(body.get("tools"))
    return chat_params(body, tools, names, stream)


def test_a_codex_request_s_fields_for_a_chat_upstream() -> None:
    body = {
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [],
        "tools": [SHELL, APPLY_PATCH, {"type": "web_search"}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "text": {"verbosity": "low"},
    }
    sent = params(body, stream=True)
    assert sent == {
        "store": False,
        "prompt_cache_key": "thread-1",
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": chat_tools(body["tools"])[0],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning_effort": "high",
    }


def test_fields_are_mapped_passed_through_or_kept_behind() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "max_output_tokens": 512,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u-1",
        "seed": 7,
        "safety_identifier": "s",
        "service_tier": "flex",
        "metadata": {"k": "v"},
        "truncation": "auto",
        "previous_response_id": "resp_0000000000000001",
        "background": False,
        "top_logprobs": 2,
        "max_tool_calls": 3,
        "frequency_penalty": 0.5,  # a chat field unknown to Responses: passed through as sent
        "temperature_schedule": "x",  # unknown to both: passed through
    }
    assert params(body) == {
        "max_tokens": 512,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u-1",
        "seed": 7,
        "safety_identifier": "s",
        "service_tier": "flex",
        "frequency_penalty": 0.5,
        "temperature_schedule": "x",
    }


def test_a_non_stream_request_asks_for_no_stream() -> None:
    sent = params({"model": "m", "stream": False})
    assert "stream" not in sent
    assert "stream_options" not in sent


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("required", "required"),
        ("none", "none"),
        ({"type": "function", "name": "shell"}, {"type": "function", "function": {"name": "shell"}}),
        ({"type": "custom", "name": "apply_patch"}, {"type": "function", "function": {"name": "apply_patch"}}),
        ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "shell"}]}, None),
        ({"type": "web_search"}, None),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    sent = params({"tools": [SHELL, APPLY_PATCH], "tool_choice": choice})
    assert sent.get("tool_choice") == expected


def test_tool_choice_and_parallel_calls_go_only_with_tools_a_chat_model_has() -> None:
    sent = params({"tools": [{"type": "web_search"}], "tool_choice": "required", "parallel_tool_calls": True})
    assert "tools" not in sent
    assert "tool_choice" not in sent
    assert "parallel_tool_calls" not in sent


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
            {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}},
        ),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        ({"format": {"type": "text"}}, None),
        ({"verbosity": "low"}, None),
        ("not an object", None),
    ],
)
def test_text_format_becomes_response_format(text: Any, expected: Any) -> None:
    assert params({"text": text}).get("response_format") == expected


def test_reasoning_without_an_effort_maps_to_nothing() -> None:
    assert "reasoning_effort" not in params({"reasoning": {"summary": "auto"}})
    assert "reasoning_effort" not in params({"reasoning": "high"})
