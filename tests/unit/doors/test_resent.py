"""A re-sent conversation parsed and converted once (`proxy.doors.resent`): the same result as a whole parse,
with the repeated elements taken from the kept request."""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Sequence
from typing import Any

import pytest

from proxy.canonical.sharing import Resent, known_shared, shared_prefix
from proxy.config.schema import RequestLimits
from proxy.doors.body import parse_json_object
from proxy.doors.chat import parse_chat_request
from proxy.doors.messages.input import parse_messages_request
from proxy.doors.resent import Conversion, ResentLists
from proxy.doors.responses.input import parse_responses_request
from proxy.errors import InvalidRequest, PayloadTooLarge
from tests.unit.canonical.test_sharing import naive

LIMITS = RequestLimits()
TENANT = "tenant-a"


def chat_body(messages: list[dict[str, Any]], **fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **fields}).encode()


def turns(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for index in range(count):
        history.append({"role": "user", "content": f"question {index} " + "x" * rng.randrange(50)})
        history.append({"role": "assistant", "content": f"answer {index} ☀️"})
    history.append({"role": "user", "content": "and now?"})
    return history


def identity_conversion(elements: Sequence[Any], first: int) -> Conversion:
    return Conversion.each([[element] for element in elements], first)


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_request_extending_the_last_takes_its_elements_as_they_were(ascii_only: bool) -> None:
    def body(messages: list[dict[str, Any]]) -> bytes:
        return json.dumps({"model": "m", "messages": messages}, ensure_ascii=ascii_only).encode()

    resent = ResentLists().of(TENANT)
    first = parse_chat_request(body(turns(20)), LIMITS, resent)
    longer = turns(21)
    second = parse_chat_request(body(longer), LIMITS, resent)
    assert second.messages == longer
    kept = len(turns(20)) - 1  # all but its last message, which the longer request changed
    assert all(second.messages[i] is first.messages[i] for i in range(kept))
    assert all(second.messages[i] is not first.messages[i] for i in range(kept, len(first.messages)))


def test_without_kept_requests_the_same_body_parses_to_new_objects() -> None:
    raw = chat_body(turns(5))
    one, two = parse_chat_request(raw, LIMITS), parse_chat_request(raw, LIMITS)
    assert one.messages == two.messages
    assert one.messages[1] is not two.messages[1]


@pytest.mark.parametrize("seed", range(40))
def test_any_sequence_of_requests_parses_as_a_whole_parse_would(seed: int) -> None:
    """Requests that extend, repeat, edit, truncate and reorder fields, with whitespace of either serializer:
    the result is always that of parsing the body alone."""
    rng = random.Random(seed)
    resent = ResentLists(max_lists=3).of(TENANT)
    history = turns(rng.randrange(1, 8), seed)
    for _ in range(12):
        change = rng.randrange(5)
        if change == 0:
            history = [*history, {"role": "assistant", "content": "more"}, {"role": "user", "content": "go on"}]
        elif change == 1 and len(history) > 2:
            history = history[: rng.randrange(1, len(history))]
            history[-1] = {"role": "user", "content": "edited"}
        elif change == 2:
            position = rng.randrange(len(history))
            history = [
                *history[:position],
                {**history[position], "content": f"changed {seed}"},
                *history[position + 1 :],
            ]
        fields = {"temperature": rng.choice([0, 0.5]), "seed": 10**30} if rng.random() < 0.5 else {}
        separators = (",", ":") if rng.random() < 0.5 else (", ", ": ")
        body = (
            {"model": "m", "messages": history, **fields}
            if rng.random() < 0.5
            else {**fields, "messages": history, "model": "m"}
        )
        raw = json.dumps(body, separators=separators, ensure_ascii=rng.random() < 0.5).encode()
        listed = resent.parse(raw, "messages", LIMITS)
        assert listed.body == parse_json_object(raw)
        assert listed.convert(identity_conversion, "messages").messages == history


def test_the_messages_door_reuses_each_converted_message() -> None:
    def body(count: int) -> bytes:
        messages: list[dict[str, Any]] = []
        for index in range(count):
            call = {"type": "tool_use", "id": f"call_{index}", "name": "Bash", "input": {"command": f"ls {index}"}}
            result = {"type": "tool_result", "tool_use_id": f"call_{index}", "content": f"file{index}"}
            messages.append({"role": "user", "content": [{"type": "text", "text": f"step {index}"}]})
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "running"}, call]})
            messages.append({"role": "user", "content": [result]})
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}  # moves every turn, as Claude Code's
        return json.dumps({"model": "claude", "max_tokens": 100, "system": "sys", "messages": messages}).encode()

    resent = ResentLists().of(TENANT)
    first = parse_messages_request(body(10), LIMITS, resent)
    second = parse_messages_request(body(11), LIMITS, resent)
    assert second.messages == parse_messages_request(body(11), LIMITS).messages
    # the system message, then 3 chat messages a step (the tool_result becomes a tool message); the last element
    # of the first request changed (its breakpoint moved), so what it became is converted again.
    reused = 1 + 3 * 10 - 1
    assert all(second.messages[i] is first.messages[i] for i in range(reused))  # the system message too
    assert second.messages[reused] is not first.messages[reused]


@pytest.mark.parametrize("system_first", [True, False])
def test_an_equal_system_prompt_is_the_same_message_and_a_changed_one_a_new_one(system_first: bool) -> None:
    """Claude Code sends `system` after `messages`, so it is parsed anew every time: an equal one still
    becomes the kept request's very message (`Listed.prelude`), and the conversation is the same objects from
    its first message (`proxy.canonical.sharing`)."""

    def body(system: Any, count: int) -> bytes:
        messages = [{"role": "user", "content": f"question {index}"} for index in range(count)]
        fields = {"system": system, "messages": messages} if system_first else {"messages": messages, "system": system}
        return json.dumps({"model": "claude", "max_tokens": 100, **fields}).encode()

    blocks = [{"type": "text", "text": "You are Claude Code. " * 50, "cache_control": {"type": "ephemeral"}}]
    resent = ResentLists().of(TENANT)
    first = parse_messages_request(body(blocks, 3), LIMITS, resent)
    second = parse_messages_request(body(blocks, 4), LIMITS, resent)
    assert second.messages[0] is first.messages[0]
    changed = [{"type": "text", "text": "You are someone else."}]
    third = parse_messages_request(body(changed, 5), LIMITS, resent)
    assert third.messages[0] is not second.messages[0]
    assert third.messages == parse_messages_request(body(changed, 5), LIMITS).messages


def test_equal_responses_instructions_are_the_same_message() -> None:
    def body(instructions: str, count: int) -> bytes:
        items = [{"role": "user", "content": f"question {index}"} for index in range(count)]
        return json.dumps({"model": "gpt", "input": items, "instructions": instructions}).encode()

    resent = ResentLists().of(TENANT)
    first = parse_responses_request(body("Be terse.", 2), LIMITS, resent).conversation
    second = parse_responses_request(body("Be terse.", 3), LIMITS, resent).conversation
    assert second.messages[0] is first.messages[0]
    third = parse_responses_request(body("Be verbose.", 4), LIMITS, resent).conversation
    assert third.messages[0]["content"] == "Be verbose."


def test_a_run_waiting_for_later_elements_is_converted_again_whole() -> None:
    """A converter whose message takes consecutive elements of a kind (a Responses run of output items) is reused
    only up to where no message waits for a later element."""

    def runs(elements: Sequence[Any], first: int) -> Conversion:
        messages: list[dict[str, Any]] = []
        origins, closed = array("q"), array("q", [0])
        for offset, element in enumerate(elements):
            if element["kind"] == "out" and messages and messages[-1]["role"] == "assistant":
                messages[-1] = {**messages[-1], "parts": [*messages[-1]["parts"], element["text"]]}
            else:
                role = "assistant" if element["kind"] == "out" else "user"
                messages.append({"role": role, "parts": [element["text"]]})
                origins.append(first + offset)
            closed.append(len(messages))
        for j in range(1, len(elements)):  # inside a run, a later element may still join the message
            if elements[j]["kind"] == "out" and elements[j - 1]["kind"] == "out":
                closed[j] = -1
        closed[len(elements)] = -1 if elements and elements[-1]["kind"] == "out" else closed[len(elements)]
        return Conversion(messages, origins, closed)

    def raw(items: list[dict[str, str]]) -> bytes:
        return json.dumps({"input": items}).encode()

    items = [{"kind": "in", "text": "q"}, {"kind": "out", "text": "a"}, {"kind": "out", "text": "b"}]
    resent = ResentLists().of(TENANT)
    resent.parse(raw(items), "input", LIMITS).convert(runs, "input")
    longer = [*items, {"kind": "out", "text": "c"}, {"kind": "in", "text": "q2"}]
    again = resent.parse(raw(longer), "input", LIMITS).convert(runs, "input")
    assert again.messages == runs(longer, 0).messages
    assert again.messages[1]["parts"] == ["a", "b", "c"]


def test_the_checks_across_messages_see_the_whole_list() -> None:
    """A call at the very end is the client's to answer; once the conversation goes on past it unanswered, the
    request is refused although its first part was accepted before."""
    resent = ResentLists().of(TENANT)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    opened = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    parse_chat_request(chat_body(opened), LIMITS, resent)
    with pytest.raises(InvalidRequest, match="call_1"):
        parse_chat_request(chat_body([*opened, {"role": "user", "content": "and?"}]), LIMITS, resent)
    # A refused list is no checked beginning for the next: its orphan output is refused again.
    orphaned = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "r"}]
    for messages in (orphaned, [*orphaned, {"role": "user", "content": "and?"}]):
        with pytest.raises(InvalidRequest, match="call_9"):
            parse_chat_request(chat_body(messages), LIMITS, resent)


def test_a_new_message_is_refused_by_its_index_and_limits_apply_to_it() -> None:
    resent = ResentLists().of(TENANT)
    history = turns(3)
    parse_chat_request(chat_body(history), LIMITS, resent)
    with pytest.raises(InvalidRequest) as refused:
        parse_chat_request(chat_body([*history, {"role": "robot", "content": "x"}]), LIMITS, resent)
    assert refused.value.param == f"messages[{len(history)}].role"
    small = RequestLimits(max_message_chars=100)
    parse_chat_request(chat_body(history), small, resent)
    with pytest.raises(PayloadTooLarge) as large:
        parse_chat_request(chat_body([*history, {"role": "user", "content": "y" * 200}]), small, resent)
    assert large.value.param == f"messages[{len(history)}]"


def test_kept_requests_of_other_limits_are_not_reused() -> None:
    resent = ResentLists().of(TENANT)
    history = [{"role": "user", "content": "z" * 150}]
    parse_chat_request(chat_body(history), LIMITS, resent)
    with pytest.raises(PayloadTooLarge):
        parse_chat_request(chat_body(history), RequestLimits(max_message_chars=100), resent)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "a"},]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}] "x": 1}',
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}]} trailing',
        b'{"model": "m", "messages": [{"role": "user", "content": NaN}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "m", "messages": [1e999]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}, "\xff"]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}, 1e999]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "x": "\\udc00"}',
        b'["not", "an", "object"]',
        b'{"model": "m",}',
        b"",
    ],
)
def test_a_malformed_body_is_refused_as_the_whole_parse_refuses_it(raw: bytes) -> None:
    resent = ResentLists().of(TENANT)
    resent.parse(b'{"model": "m", "messages": [{"role": "user", "content": "a"}]}', "messages", LIMITS).convert(
        identity_conversion, "messages"
    )
    with pytest.raises(InvalidRequest) as whole:
        parse_json_object(raw)
    with pytest.raises(InvalidRequest) as listed:
        resent.parse(raw, "messages", LIMITS)
    assert str(listed.value) == str(whole.value)


def test_an_element_that_only_begins_alike_is_parsed_again() -> None:
    resent = ResentLists().of(TENANT)
    resent.parse(b'{"messages": [1, 2]}', "messages", LIMITS).convert(identity_conversion, "messages")
    listed = resent.parse(b'{"messages": [1, 23]}', "messages", LIMITS)
    assert listed.elements == [1, 23]


def test_a_key_given_twice_takes_the_last_list() -> None:
    resent = ResentLists().of(TENANT)
    raw = b'{"messages": [1, 2], "messages": [1, 2, 3]}'
    resent.parse(raw, "messages", LIMITS).convert(identity_conversion, "messages")
    again = resent.parse(raw.replace(b"3]", b"3, 4]"), "messages", LIMITS)
    assert again.elements == [1, 2, 3, 4]
    assert again.body == {"messages": [1, 2, 3, 4]}


def test_the_kept_requests_are_bounded() -> None:
    resent = ResentLists(max_lists=2, max_bytes=10_000).of(TENANT)
    for index in range(5):
        resent.parse(chat_body([{"role": "user", "content": f"{index}"}]), "messages", LIMITS).convert(
            identity_conversion, "messages"
        )
    assert len(resent.lists._kept) == 2
    resent.parse(chat_body([{"role": "user", "content": "w" * 20_000}]), "messages", LIMITS).convert(
        identity_conversion, "messages"
    )
    assert len(resent.lists._kept) == 2  # one larger than the bound is not kept, and pushes none out


def responses_body(items: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "m", "instructions": "be brief", "input": items}).encode()


@pytest.mark.parametrize("seed", range(20))
def test_the_responses_door_converts_as_a_whole_parse_would_runs_included(seed: int) -> None:
    """Codex re-sends its input with new items after it; a run of output items (reasoning, calls, a message)
    that goes on past the previous request's end is converted again whole."""
    rng = random.Random(seed)
    resent = ResentLists().of(TENANT)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "start"}]
    calls = 0
    for _ in range(10):
        for _ in range(rng.randrange(1, 4)):
            kind = rng.choice(["reasoning", "call", "message", "user"])
            if kind == "reasoning":
                items.append({"type": "reasoning", "id": f"rs_{len(items)}", "summary": [], "encrypted_content": "e"})
            elif kind == "call":
                calls += 1
                items.append({"type": "function_call", "call_id": f"c{calls}", "name": "sh", "arguments": "{}"})
                items.append({"type": "function_call_output", "call_id": f"c{calls}", "output": f"out {calls}"})
            elif kind == "message":
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
                )
            else:
                items.append({"type": "message", "role": "user", "content": f"more {len(items)}"})
        request = parse_responses_request(responses_body(items), LIMITS, resent)
        assert (
            request.conversation.messages
            == parse_responses_request(responses_body(items), LIMITS).conversation.messages
        )


def test_a_responses_input_with_a_compaction_item_is_split_as_before() -> None:
    resent = ResentLists().of(TENANT)
    items = [{"type": "message", "role": "user", "content": "hi"}]
    parse_responses_request(responses_body(items), LIMITS, resent)
    with pytest.raises(InvalidRequest, match="compaction_trigger"):
        parse_responses_request(responses_body([{"type": "compaction_trigger"}, *items]), LIMITS, resent)


def test_a_compaction_item_after_a_kept_input_is_still_found() -> None:
    """The kept input's items are not read again for compaction items, the new ones are."""
    resent = ResentLists().of(TENANT)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "hi"}]
    parse_responses_request(responses_body(items), LIMITS, resent)
    request = parse_responses_request(responses_body([*items, {"type": "compaction_trigger"}]), LIMITS, resent)
    assert request.compact


def test_a_call_a_kept_input_answered_past_what_is_re_sent_of_it_is_refused() -> None:
    """A Responses call may be answered after other items: one re-sent without the output a kept input held for
    it, with the conversation going on, is refused as a whole parse refuses it (the checks read past a kept
    input only when all of it is re-sent)."""
    resent = ResentLists().of(TENANT)
    call = {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "o"}
    user = {"type": "message", "role": "user", "content": "hi"}
    answered = [user, call, {"type": "message", "role": "user", "content": "meanwhile"}, output]
    parse_responses_request(responses_body(answered), LIMITS, resent)
    going_on = [*answered[:3], {"type": "message", "role": "user", "content": "next"}]
    with pytest.raises(InvalidRequest, match="No tool output found for function call c1"):
        parse_responses_request(responses_body(going_on), LIMITS, resent)
    parse_responses_request(responses_body(answered), LIMITS, resent)
    with pytest.raises(InvalidRequest, match="No tool call found for function call output with call_id c2"):
        parse_responses_request(responses_body([*answered, {**output, "call_id": "c2"}]), LIMITS, resent)


def test_a_tenant_builds_only_on_its_own_requests() -> None:
    """Another tenant's kept request would tell, by how quickly it is answered, what that tenant sent."""
    lists = ResentLists()
    history = turns(10)
    mine = parse_chat_request(chat_body(history), LIMITS, lists.of("a"))
    theirs = parse_chat_request(chat_body(history), LIMITS, lists.of("b"))
    again = parse_chat_request(chat_body(history), LIMITS, lists.of("a"))
    assert theirs.messages == mine.messages
    assert theirs.messages[1] is not mine.messages[1]
    assert again.messages[1] is mine.messages[1]


def test_only_what_follows_the_repeated_elements_is_scanned_members_after_the_list_included() -> None:
    """Claude Code sends `system` and `tools` after `messages`: they are read from the new body every time."""
    resent = ResentLists().of(TENANT)

    def body(count: int, tools: str) -> bytes:
        messages = [{"role": "user", "content": f"m{index} é"} for index in range(count)]
        return json.dumps({"model": "m", "messages": messages, "tools": [{"name": tools}]}, ensure_ascii=False).encode()

    resent.parse(body(5, "a"), "messages", LIMITS).convert(identity_conversion, "messages")
    listed = resent.parse(body(6, "b"), "messages", LIMITS)
    assert listed.body == json.loads(body(6, "b"))
    assert listed._scan is not None
    assert listed._scan.scanned.reused == 5
    assert len(listed._scan.text) < len(body(6, "b").decode())  # the repeated part was not decoded again


@pytest.mark.parametrize("door", ["chat", "messages", "responses"])
@pytest.mark.parametrize("seed", range(15))
def test_a_requests_messages_know_how_far_they_are_the_kept_requests(door: str, seed: int) -> None:
    """A request's messages are made from those of the kept request it resumed (`sharing.Resent`): what they say
    they share with any earlier request's messages is what comparing them object by object gives, whether the
    conversation grows, is edited or cut back, or its system prompt (instructions) changes."""
    rng = random.Random(seed)
    resent = ResentLists(max_lists=2).of(TENANT)
    history = [{"role": "user", "content": "start"}]
    system = "be brief"
    earlier: list[Sequence[dict[str, Any]]] = []
    known = 0
    for _ in range(10):
        change = rng.randrange(5)
        if change <= 1:
            history = [
                *history,
                {"role": "assistant", "content": f"ok {len(history)}"},
                {"role": "user", "content": "go"},
            ]
        elif change == 2 and len(history) > 2:
            history = [*history[: rng.randrange(1, len(history) - 1)], {"role": "user", "content": f"edit {seed}"}]
        elif change == 3:
            system = rng.choice(["be brief", "be thorough"])
        if door == "chat":
            messages = parse_chat_request(
                chat_body([{"role": "system", "content": system}, *history]), LIMITS, resent
            ).messages
        elif door == "messages":
            raw = json.dumps({"model": "claude", "max_tokens": 9, "messages": history, "system": system}).encode()
            messages = parse_messages_request(raw, LIMITS, resent).messages
        else:
            raw = json.dumps({"model": "gpt", "input": history, "instructions": system}).encode()
            messages = parse_responses_request(raw, LIMITS, resent).conversation.messages
        for old in earlier:
            assert shared_prefix(messages, old) == naive(messages, old)
        assert isinstance(messages, Resent)
        known += any(known_shared(messages, old) for old in earlier)
        earlier.append(messages)
    assert known  # the kept request's messages, shared without a pass
