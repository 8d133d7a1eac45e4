"""A Gemini `generateContent` request as the canonical conversation: contents of parts → chat messages, fields →
chat fields. The model is the path's (`models/{model}:method`), never the body's.

Each chat message keeps the parts it stands for (`vocabulary.ITEMS`), as the client sent them (thought parts and
their `thoughtSignature`, inline data), so nothing is lost; its identity is its chat meaning only:

    systemInstruction (a Content, or a string)  a system message: its text parts joined
    a `user` turn (or `function`, Gemini's old   a tool message per `functionResponse` part (answering the call of
    name for tool results)                       its `id`, its `response` as JSON), then a user message with the
                                                 other parts: its text as one string, or chat parts (an image)
    a `model` turn                               one assistant message: its text parts joined (not the thoughts),
                                                 a tool call per `functionCall` part (`args` as JSON arguments)

Gemini CLI opens a conversation with a `<session_context>` part of its own, made anew by each process (the
directory tree changes as it works): it is a system message, so a resumed session is the same conversation; and a
response sent twice in one turn (its resumed sessions repeat each) is one tool message.

A call without an `id` (a client that builds its history by hand) is named by its function and its place among
that turn's calls of the same name (`read_file#0`), and so is a response without one in the next turn: Gemini
answers a turn's calls in the turn after it, in order.

Fields for a chat upstream: `proxy.doors.gemini.fields`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.canonical.conversation import Conversation
from proxy.canonical.pieces import Received
from proxy.canonical.tool_pairs import MAX_SHOWN_ID_CHARS, shown_ids, unanswered_calls, unanswered_output
from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS
from proxy.config.schema import RequestLimits
from proxy.doors.body import check_message_size, check_shape
from proxy.doors.gemini.fields import generation_config, generation_params
from proxy.doors.resent import Conversion, TenantLists, parse_listed
from proxy.errors import InvalidRequest, json_type

USER_ROLES = ("user", "function")
MODEL_ROLE = "model"
_DATA_PARTS = ("inlineData", "fileData")
SESSION_CONTEXT, SESSION_CONTEXT_END = "<session_context>", "</session_context>"
"""Gemini CLI's own first part (0.61.0: the date, the OS, the workspace's directory tree), made anew by each
process: a system message, so that a resumed session (`gemini --resume`) is the same conversation."""
FIRST_CONTENT = "contents[0]"


def parse_generate_request(
    raw: Received | bytes,
    model: str,
    stream: bool,
    limits: RequestLimits,
    resent: TenantLists | None = None,
) -> Conversation:
    """A `generateContent` / `streamGenerateContent` request for `model` (the path's) as the canonical
    conversation; `InvalidRequest` naming the field for anything invalid. `resent`: the door's last requests,
    whose contents this one need not convert again."""
    listed = parse_listed(raw, "contents", limits, resent)
    body = listed.body
    check_shape({key: value for key, value in body.items() if key != "contents"}, "", limits)
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise InvalidRequest("* GenerateContentRequest.contents: contents is not specified", param="contents")
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system is not None:
        check_message_size(system, "systemInstruction", limits)
    prelude = listed.prelude(system, _system)
    listed.convert(_converted, "contents", _check_pairs, prelude)
    config = generation_config(body)
    params = generation_params(config, body)
    max_output = params.get("max_tokens")
    if stream:
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}
    return Conversation(
        model=model,
        messages=listed.messages,
        params=params,
        stream=stream,
        max_output=max_output if isinstance(max_output, int) else None,
        max_output_param="generationConfig.maxOutputTokens",
        identity={**body, "model": model},
        door_state={"door": "gemini"},
    )


def count_request_conversation(body: Mapping[str, Any], model: str, limits: RequestLimits) -> Conversation:
    """A `countTokens` body (`contents`, or a whole `generateContentRequest`) as a conversation to count."""
    inner = body.get("generateContentRequest")
    if isinstance(inner, dict):
        body = inner
    contents = body.get("contents")
    if not isinstance(contents, list):
        raise InvalidRequest("* CountTokensRequest.contents: contents is not specified", param="contents")
    conversion = _converted(contents, 0)
    _check_pairs(conversion)
    system = body.get("systemInstruction", body.get("system_instruction"))
    params = generation_params(generation_config(body), body)
    return Conversation(
        model=model,
        messages=[*_system(system), *conversion.messages],
        params=params,
        stream=False,
        max_output=None,
        max_output_param="generationConfig.maxOutputTokens",
        identity={},
    )


def _system(system: Any) -> list[Message]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if not isinstance(system, dict):
        raise InvalidRequest(
            f"Invalid value at 'system_instruction': expected a Content object, got {json_type(system)}",
            param="systemInstruction",
        )
    parts = _parts(system, "system_instruction")
    texts = [part["text"] for part in parts if isinstance(part.get("text"), str) and not part.get("thought")]
    return [{"role": "system", "content": "\n".join(texts), ITEMS: parts}]


def chat_messages(contents: Sequence[Any]) -> list[Message]:
    """The contents as chat messages (see the module docstring)."""
    conversion = _converted(contents, 0)
    _check_pairs(conversion)
    return conversion.messages


def _converted(contents: Sequence[Any], first: int) -> Conversion:
    return Conversion.each(
        [_chat_messages(content, f"contents[{first + i}]") for i, content in enumerate(contents)], first
    )


def _chat_messages(content: Any, where: str) -> list[Message]:
    if not isinstance(content, dict):
        raise InvalidRequest(f"Invalid value at '{where}': expected a Content object", param=where)
    role = content.get("role", "user")
    if role != MODEL_ROLE and role not in USER_ROLES:
        raise InvalidRequest(
            f"Please use a valid role: user, model. Got {str(role)[:40]!r} at '{where}.role'.", param=f"{where}.role"
        )
    parts = _parts(content, where)
    if role == MODEL_ROLE:
        return [_assistant(parts, where)]
    if where == FIRST_CONTENT and _is_session_context(parts[0]):
        context: Message = {"role": "system", "content": parts[0]["text"], ITEMS: [parts[0]]}
        return [context, *(_user(parts[1:], where) if len(parts) > 1 else [])]
    return _user(parts, where)


def _is_session_context(part: Mapping[str, Any]) -> bool:
    text = part.get("text")
    return isinstance(text, str) and text.startswith(SESSION_CONTEXT) and text.rstrip().endswith(SESSION_CONTEXT_END)


def _parts(content: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise InvalidRequest(
            f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.", param=f"{where}.parts"
        )
    for index, part in enumerate(parts):
        place = f"{where}.parts[{index}]"
        if not isinstance(part, dict):
            raise InvalidRequest(f"Invalid value at '{place}': expected a Part object", param=place)
        text = part.get("text")
        if text is not None and not isinstance(text, str):
            raise InvalidRequest(f"Invalid value at '{place}.text': expected a string", param=f"{place}.text")
    return parts


def _assistant(parts: Sequence[dict[str, Any]], where: str) -> Message:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    names: Counter[str] = Counter()
    for index, part in enumerate(parts):
        place = f"{where}.parts[{index}]"
        call = part.get("functionCall", part.get("function_call"))
        if call is not None:
            name, args = _call(call, f"{place}.functionCall")
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"{name}#{names[name]}"
            names[name] += 1
            arguments = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif isinstance(part.get("text"), str) and not part.get("thought"):
            texts.append(part["text"])
    message: Message = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    message[ITEMS] = list(parts)
    return message


def _call(call: Any, where: str) -> tuple[str, dict[str, Any]]:
    name = call.get("name") if isinstance(call, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"* GenerateContentRequest.{where}.name: Name cannot be empty.", param=f"{where}.name")
    args = call.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidRequest(f"Invalid value at '{where}.args': expected an object", param=f"{where}.args")
    return name, args


def _user(parts: Sequence[dict[str, Any]], where: str) -> list[Message]:
    messages: list[Message] = []
    rest: list[dict[str, Any]] = []
    names: Counter[str] = Counter()
    answered: set[str] = set()
    for index, part in enumerate(parts):
        response = part.get("functionResponse", part.get("function_response"))
        if response is None:
            rest.append(part)
            continue
        if part in parts[:index]:
            continue  # the same response twice in one turn (Gemini CLI 0.61.0's resumed sessions): one tool message
        given = response.get("id") if isinstance(response, dict) else None
        if isinstance(given, str) and given in answered:
            continue  # the same call's response again in another form (resumed, one of them masked): the first
        if isinstance(given, str):
            answered.add(given)
        place = f"{where}.parts[{index}].functionResponse"
        name = response.get("name") if isinstance(response, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"* GenerateContentRequest.{place}.name: Name cannot be empty.", param=f"{place}.name")
        call_id = response.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"{name}#{names[name]}"
        names[name] += 1
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _result_text(response), ITEMS: [part]})
    if rest:
        messages.append({"role": "user", "content": _chat_content(rest), ITEMS: rest})
    return messages


def _result_text(response: Mapping[str, Any]) -> str:
    """A function's result as the text a chat model reads: its `output` (Gemini CLI's) or `error` when that is
    all the response holds, else the response as JSON."""
    result = response.get("response")
    if isinstance(result, dict) and len(result) == 1:
        (key, value), *_ = result.items()
        if key in ("output", "error", "result", "content") and isinstance(value, str):
            return f"[error] {value}" if key == "error" else value
    return "" if result is None else json.dumps(result, ensure_ascii=False)


def _chat_content(parts: Sequence[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only parts as one string (thoughts left out); else chat parts, an image as its data URL."""
    if not any(kind in part for part in parts for kind in _DATA_PARTS):
        return "\n".join(
            part["text"] for part in parts if isinstance(part.get("text"), str) and not part.get("thought")
        )
    chat: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part.get("text"), str):
            chat.append({"type": "text", "text": part["text"]})
            continue
        data = part.get("inlineData")
        if isinstance(data, dict) and str(data.get("mimeType", "")).startswith("image/"):
            url = f"data:{data['mimeType']};base64,{data.get('data', '')}"
            chat.append({"type": "image_url", "image_url": {"url": url}})
        else:
            kind = next(iter(part), "part")
            chat.append({"type": "text", "text": f"[{kind}]"})  # kept whole in the message's items
    return chat


def _check_pairs(conversion: Conversion, start: int = 0) -> None:
    """Each functionResponse answers a functionCall before it; a turn's calls are answered by the next turn."""
    messages, origins = conversion.messages, conversion.origins
    orphan = unanswered_output(messages, start)
    if orphan is not None:
        raise InvalidRequest(
            f"* GenerateContentRequest.contents: a functionResponse answers no functionCall before it "
            f"(id {orphan[:MAX_SHOWN_ID_CHARS]!r}).",
            param="contents",
        )
    unanswered = unanswered_calls(messages, start=start)
    if unanswered is not None:
        index, ids = unanswered
        where = f"contents[{origins[index]}]"
        raise InvalidRequest(
            f"* GenerateContentRequest.{where}: function calls were not answered by functionResponse parts in the "
            f"next turn: {shown_ids(ids)}. Please ensure that the number of function response parts is equal to "
            "the number of function call parts of the function call turn.",
            param=where,
        )
