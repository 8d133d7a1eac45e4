"""Token counting: long texts are counted in segments with bounded memory, exactly for ordinary text."""

from __future__ import annotations

import random
import string

from proxy import environment
from proxy.tokens import SEGMENT_CHARS, _encoding, count_text, rough_size


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
