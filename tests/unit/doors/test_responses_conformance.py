"""Every input the Responses API reference allows, accepted by the door and kept as sent
(`proxy.doors.responses.input`, `proxy.formats.responses_items`).

The cases are not written from memory: they are built from the installed openai SDK's own param types. Each
member of `ResponseInputItemParam` (a TypedDict) gives a minimal item (its Required keys), a full one (every key)
and one per alternative of a field that is a union (a computer action, a content part, a caller, ...); the
EasyInputMessage gives each role × content form (a string, a list of each part type) × `phase`. For each, an input
of a user message, the call it answers (when it answers one) and the item must be accepted, and a Responses-native
upstream must get the input back exactly as sent. The two items the proxy answers itself (`compaction`,
`compaction_trigger`: `proxy.doors.responses.compaction`) are read, not kept, and are checked apart.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

import pytest
from openai.types.responses.easy_input_message_param import EasyInputMessageParam
from openai.types.responses.response_input_param import ResponseInputParam
from openai.types.responses.response_output_item import ResponseOutputItem
from typing_extensions import is_typeddict

from proxy.canonical.vocabulary import ITEMS, chat_messages
from proxy.config.schema import RequestLimits
from proxy.doors.responses.compaction import COMPACTION, TRIGGER, compaction_item
from proxy.doors.responses.input import ResponsesRequest, parse_responses_request
from proxy.errors import InvalidRequest
from proxy.formats.responses_items import input_items, is_output

LIMITS = RequestLimits()
TEXT = "c1"
"""Every string an example holds: so a call's id, its output's call_id and an approval's request id all agree."""
STRINGS = {"arguments": "{}"}
"""Strings whose value has a form of its own."""
HANDLED = frozenset({COMPACTION, TRIGGER})
"""Items the proxy answers itself: they are read, not kept (checked apart, below)."""


def _union_members(hint: Any) -> list[Any]:
    return [arg for arg in get_args(hint) if arg is not type(None)]


def _is_union(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType)


def _unwrap(hint: Any) -> Any:
    """A field's type without Required/NotRequired, and without Optional when something else is allowed."""
    while get_origin(hint) in (Required, NotRequired):
        hint = get_args(hint)[0]
    if _is_union(hint):
        members = _union_members(hint)
        if len(members) == 1:
            return members[0]
    return hint


def _fields(typed_dict: Any) -> dict[str, Any]:
    return get_type_hints(typed_dict, include_extras=True)


def _required(typed_dict: Any) -> list[str]:
    return [key for key, hint in _fields(typed_dict).items() if get_origin(hint) is Required]


def _literal(typed_dict: Any, key: str) -> tuple[str, ...]:
    hint = _unwrap(_fields(typed_dict).get(key, Any))
    return get_args(hint) if get_origin(hint) is Literal else ()


def example(hint: Any, key: str = "") -> Any:
    """A minimal valid value of a param type: a TypedDict with its Required keys, a union's first member."""
    hint = _unwrap(hint)
    origin = get_origin(hint)
    if origin is Literal:
        return get_args(hint)[0]
    if _is_union(hint):
        return example(_union_members(hint)[0], key)
    if origin in (list, Iterable, Sequence):
        return [example(get_args(hint)[0])]
    if origin is dict:
        return {"k": example(get_args(hint)[1])}
    if is_typeddict(hint):
        return {name: example(_fields(hint)[name], name) for name in _required(hint)}
    if hint is str:
        return STRINGS.get(key, TEXT)
    if hint is bool:
        return True
    if hint is int:
        return 1
    if hint is float:
        return 1.0
    if hint is object:
        return {}
    raise AssertionError(f"no example for {hint!r}")


def alternatives(hint: Any, key: str) -> list[Any]:
    """A value per member of a union field (or of a list's element union): each form the field may take."""
    hint = _unwrap(hint)
    if _is_union(hint):
        return [value for member in _union_members(hint) for value in alternatives(member, key)]
    if get_origin(hint) in (list, Iterable, Sequence) and _is_union(_unwrap(get_args(hint)[0])):
        return [[example(member)] for member in _union_members(_unwrap(get_args(hint)[0]))]
    return [example(hint, key)]


def item_examples(typed_dict: Any) -> list[dict[str, Any]]:
    """An item type's examples: minimal, full, and one per form of each union field (on the full item)."""
    fields = _fields(typed_dict)
    minimal = {key: example(fields[key], key) for key in _required(typed_dict)}
    full = {key: example(hint, key) for key, hint in fields.items()}
    found = [minimal, full]
    for key, hint in fields.items():
        found.extend({**full, key: value} for value in alternatives(hint, key)[1:])
    unique: list[dict[str, Any]] = []
    for item in found:
        if item not in unique:
            unique.append(item)
    return unique


ITEM_TYPES: list[Any] = list(get_args(get_args(ResponseInputParam)[0]))
TYPES = {kind: typed_dict for typed_dict in ITEM_TYPES for kind in _literal(typed_dict, "type")}
[OUTPUT_MESSAGE] = [typed_dict for typed_dict in ITEM_TYPES if _literal(typed_dict, "role") == ("assistant",)]
"""The model's message as an input item (`ResponseOutputMessageParam`): output_text parts, an id, a status."""


def _case_id(typed_dict: Any, index: int) -> str:
    return f"{typed_dict.__name__}-{index}"


ITEM_CASES = [
    pytest.param(typed_dict, item, id=_case_id(typed_dict, index))
    for typed_dict in ITEM_TYPES
    for index, item in enumerate(item_examples(typed_dict))
    if not set(_literal(typed_dict, "type")) & HANDLED
]


def answered_call(item: dict[str, Any]) -> dict[str, Any] | None:
    """The call an item answers, by the SDK's naming (`X_output` answers `X` or `X_call`, `X_response` answers
    `X_request`): built first, as the API requires."""
    kind = str(item.get("type"))
    for suffix, call_suffixes in (("_output", ("", "_call")), ("_response", ("_request",))):
        if kind.endswith(suffix):
            base = kind.removesuffix(suffix)
            for call_suffix in call_suffixes:
                if base + call_suffix in TYPES:
                    return example(TYPES[base + call_suffix])
    return None


def parse(items: list[Any]) -> ResponsesRequest:
    return parse_responses_request(json.dumps({"model": "m", "input": items}).encode(), LIMITS)


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_the_sdk_types_are_read() -> None:
    """The derivation sees the SDK's items (a guard against an SDK change that would leave nothing to test)."""
    assert {"message", "function_call", "function_call_output", "reasoning", "item_reference"} <= set(TYPES)
    assert len(ITEM_CASES) > 2 * len(ITEM_TYPES)


@pytest.mark.parametrize(("typed_dict", "item"), ITEM_CASES)
def test_every_input_item_type_is_accepted_and_kept_as_sent(typed_dict: Any, item: dict[str, Any]) -> None:
    call = answered_call(item)
    sent = [user(), *([call] if call else []), item]
    messages = parse(sent).conversation.messages
    assert input_items(messages) == sent
    assert messages[-1][ITEMS][-1] == item


ROLES = get_args(_unwrap(_fields(EasyInputMessageParam)["role"]))
PHASES = get_args(_unwrap(_fields(EasyInputMessageParam)["phase"]))
CONTENT_FORMS = alternatives(_fields(EasyInputMessageParam)["content"], "content")
MESSAGE_CASES = [
    pytest.param(role, content, phase, typed, id=f"{role}-{index}-{phase}-{'typed' if typed else 'easy'}")
    for role in ROLES
    for index, content in enumerate(CONTENT_FORMS)
    for phase in (None, *PHASES)
    for typed in (False, True)
]


def test_the_message_forms_are_read() -> None:
    assert set(ROLES) == {"user", "assistant", "system", "developer"}  # so "tool" and "critic" are refused
    assert set(PHASES) == {"commentary", "final_answer"}
    assert TEXT in CONTENT_FORMS  # the string form
    kinds = {part["type"] for form in CONTENT_FORMS if isinstance(form, list) for part in form}
    assert kinds == {"input_text", "input_image", "input_file"}


@pytest.mark.parametrize(("role", "content", "phase", "typed"), MESSAGE_CASES)
def test_every_easy_input_message_is_accepted_kept_and_says_its_text(
    role: str, content: Any, phase: str | None, typed: bool
) -> None:
    message: dict[str, Any] = {"role": role, "content": content}
    if phase is not None:
        message["phase"] = phase
    if typed:
        message["type"] = "message"
    sent = [user("first"), message]
    messages = parse(sent).conversation.messages
    assert input_items(messages) == sent
    assert messages[-1][ITEMS] == [message]
    assert messages[-1]["role"] == role
    said = chat_messages(messages)[-1]
    if content == TEXT or content == [{"type": "input_text", "text": TEXT}]:
        assert said["content"] == TEXT  # the text reaches a chat upstream, whatever the role


@pytest.mark.parametrize("phase", PHASES)
def test_an_output_message_keeps_its_phase(phase: str) -> None:
    message = {**example(OUTPUT_MESSAGE), "phase": phase}
    messages = parse([user(), message]).conversation.messages
    assert messages[-1][ITEMS] == [message]
    assert messages[-1]["content"] == TEXT


OUTPUT_KINDS = {
    kind
    for model in get_args(get_args(ResponseOutputItem)[0])
    for kind in get_args(model.model_fields["type"].annotation)
}
"""The item types a response's output may hold (the SDK's `ResponseOutputItem`, a pydantic union)."""
ANSWERS = {kind for kind in OUTPUT_KINDS if kind in TYPES and answered_call({"type": kind}) is not None}
"""Of those, the ones that answer a call: a client sends them, after the call, outside the model's turn."""
CLIENT_ROLES = {
    kind for kind in OUTPUT_KINDS if kind in TYPES and _literal(TYPES[kind], "role") not in ((), ("assistant",))
}
"""Of those, the ones another role gives (`additional_tools`: the developer's)."""
MODEL_OUTPUT = sorted(OUTPUT_KINDS - ANSWERS - CLIENT_ROLES - HANDLED)


def test_the_output_kinds_are_read() -> None:
    assert {"message", "reasoning", "function_call", "custom_tool_call"} <= set(MODEL_OUTPUT)
    assert {"function_call_output", "custom_tool_call_output"} <= ANSWERS


@pytest.mark.parametrize("kind", MODEL_OUTPUT)
def test_every_kind_of_model_output_joins_the_assistant_turn(kind: str) -> None:
    """Reasoning, then the item, then the model's text: one assistant message, as a native upstream stores the
    answer, so an answer echoed back lands on the node it was stored as."""
    item = example(OUTPUT_MESSAGE if kind == "message" else TYPES[kind])
    reasoning = example(TYPES["reasoning"])
    answer = example(OUTPUT_MESSAGE)
    assert is_output(item)
    messages = parse([user(), reasoning, item, answer]).conversation.messages
    assert [message["role"] for message in messages] == ["user", "assistant"]
    assert messages[1][ITEMS] == [reasoning, item, answer]


def test_a_server_executed_tool_search_and_its_output_are_the_model_s_turn() -> None:
    call = {**example(TYPES["tool_search_call"]), "execution": "server"}
    output = {**example(TYPES["tool_search_output"]), "execution": "server"}
    messages = parse([user(), call, output, example(OUTPUT_MESSAGE)]).conversation.messages
    assert [message["role"] for message in messages] == ["user", "assistant"]


@pytest.mark.parametrize("kind", ["function_call", "custom_tool_call"])
def test_calls_and_their_outputs_pair_as_chat_tool_calls(kind: str) -> None:
    output_kind = f"{kind}_output"
    reasoning = example(TYPES["reasoning"])
    call = {**example(TYPES[kind]), "call_id": "call_a"}
    second = {**call, "call_id": "call_b"}
    outputs = [{**example(TYPES[output_kind]), "call_id": call_id} for call_id in ("call_a", "call_b")]
    messages = parse([user(), reasoning, call, second, *outputs]).conversation.messages
    chat = chat_messages(messages)
    assert [message["role"] for message in chat] == ["user", "assistant", "tool", "tool"]
    assert [tool_call["id"] for tool_call in chat[1]["tool_calls"]] == ["call_a", "call_b"]
    assert [message["tool_call_id"] for message in chat[2:]] == ["call_a", "call_b"]
    assert messages[1][ITEMS] == [reasoning, call, second]


def test_an_output_without_its_call_is_refused_naming_the_input() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse([user(), {**example(TYPES["function_call_output"]), "call_id": "call_x"}])
    assert refused.value.param == "input"
    assert refused.value.status == 400


def test_a_compaction_trigger_is_read_not_kept() -> None:
    parsed = parse([user(), example(TYPES[TRIGGER])])
    assert parsed.compact is True
    assert input_items(parsed.conversation.messages) == [user()]


def test_a_compaction_item_of_the_proxy_is_read_and_another_is_refused_naming_it() -> None:
    ours = compaction_item("a" * 64, "cmp_1")
    conversation = parse([ours, user()]).conversation
    assert conversation.continues is not None
    assert input_items(conversation.messages) == [user()]
    with pytest.raises(InvalidRequest) as refused:
        parse([example(TYPES[COMPACTION]), user()])
    assert refused.value.param == "input[0]"
    assert refused.value.status == 400


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "tool", "content": TEXT}, "input[1].role"),
        ({"type": "message", "role": "critic", "content": TEXT}, "input[1].role"),
        ({"role": "user", "content": 5}, "input[1].content"),
        ({"role": "assistant", "content": [{"text": TEXT}]}, "input[1].content[0]"),
        ({"content": TEXT}, "input"),
        ({"type": None, "content": TEXT}, "input"),
    ],
)
def test_what_the_sdk_types_do_not_allow_is_refused_naming_the_param(item: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse([user(), item])
    assert refused.value.param == param
    assert refused.value.status == 400
