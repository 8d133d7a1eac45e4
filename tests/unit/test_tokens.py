"""Token counting: long texts are counted in segments with bounded memory, exactly for ordinary text."""

from __future__ import annotations

import base64
import json
import random
import string

from proxy import environment
from proxy.tokens import (
    FILE_PAGE_BYTES,
    FILE_PAGE_TOKENS,
    IMAGE_PART_TOKENS,
    SEGMENT_CHARS,
    TOKENS_PER_TOOL,
    TOOLS_OVERHEAD,
    _encoding,
    count_definitions,
    count_message,
    count_text,
    rough_size,
)


def whole(text: str) -> int:
    return len(_encoding("cl100k_base").encode_ordinary(text))


def test_a_long_text_of_words_counts_exactly_as_one_piece() -> None:
    environment.prepare()
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_letters + "(){}.,;:'\"", k=rng.randint(1, 12))) for _ in range(2000)]
    text = " ".join(rng.choices(words, k=SEGMENT_CHARS))
    assert len(text) > 4 * SEGMENT_CHARS
    assert count_text(text) == whole(text)


def test_a_long_text_without_spaces_is_counted_in_segments_close_to_whole() -> None:
    environment.prepare()
    text = "ab1" * SEGMENT_CHARS
    segmented, exact = count_text(text), whole(text)
    assert abs(segmented - exact) <= 2 * (len(text) // SEGMENT_CHARS + 1)


def test_short_texts_are_counted_whole() -> None:
    environment.prepare()
    assert count_text("hello world") == whole("hello world") == 2


def test_rough_size_counts_text_parts_and_tool_arguments() -> None:
    assert rough_size({"role": "user", "content": "abc"}) == 3
    assert rough_size({"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image_url"}]}) == 2
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert rough_size({"role": "assistant", "content": None, "tool_calls": [call]}) == 8


def function(name: str, description: str, parameters: dict[str, object]) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def test_tool_definitions_count_as_their_name_description_and_schema() -> None:
    environment.prepare()
    schema: dict[str, object] = {"type": "object", "properties": {"command": {"type": "string"}}}
    tools = [function("Bash", "Run a shell command " * 50, schema), function("Read", "Read a file", schema)]
    texts = ["Bash", "Run a shell command " * 50, "Read", "Read a file", *[json.dumps(schema, sort_keys=True)] * 2]
    expected = TOOLS_OVERHEAD + 2 * TOKENS_PER_TOOL + sum(whole(text) for text in texts)
    assert count_definitions({"tools": tools}) == expected
    assert count_definitions({"tools": tools, "temperature": 0}) == expected  # other fields cost nothing
    assert count_definitions({}) == 0
    assert count_definitions({"tools": "not a list"}) == 0


def test_a_schema_with_an_integer_past_64_bits_is_counted_too() -> None:
    environment.prepare()
    schema: dict[str, object] = {"type": "integer", "maximum": 2**70}
    expected = TOOLS_OVERHEAD + TOKENS_PER_TOOL + whole("Count") + whole(json.dumps(schema, sort_keys=True))
    assert count_definitions({"tools": [function("Count", "", schema)]}) == expected


def test_a_structured_output_schema_counts_like_a_tool() -> None:
    environment.prepare()
    schema = {"type": "object", "properties": {"answer": {"type": "string", "description": "the answer " * 20}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    counted = count_definitions({"response_format": response_format})
    assert counted == TOKENS_PER_TOOL + whole("reply") + whole(json.dumps(schema, sort_keys=True))
    assert count_definitions({"response_format": {"type": "json_object"}}) == 0


def test_images_and_files_count_by_the_providers_estimates() -> None:
    environment.prepare()
    pdf = base64.b64encode(b"%PDF" + bytes(3 * FILE_PAGE_BYTES)).decode()
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "file", "file": {"file_data": pdf}},
        {"type": "file", "file": {"file_id": "file-1"}},
    ]
    text_only = count_message({"role": "user", "content": [{"type": "text", "text": "hi"}]})
    with_media = count_message({"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]})
    assert with_media - text_only == IMAGE_PART_TOKENS + 4 * FILE_PAGE_TOKENS + FILE_PAGE_TOKENS
