"""The marathon's scripted model answers each turn with the last line its command printed, whatever the CLI writes
around a tool's output: a wrong answer in the marathon's table is then the proxy's doing, not the fake's."""

from __future__ import annotations

from bench.harness.marathon import last_printed_line

ROWS = "\n".join(f"turn 3 row {n}: alpha beta gamma delta epsilon zeta eta theta" for n in range(1, 4))


def test_gemini_clis_wrapper_around_the_output_is_not_the_last_line() -> None:
    content = f"<untrusted_context>\nOutput: {ROWS}\nProcess Group PGID: 23004\n</untrusted_context>"

    assert last_printed_line({"role": "tool", "content": content}).startswith("turn 3 row 3: ")


def test_a_bare_output_answers_its_last_line() -> None:
    assert last_printed_line({"role": "tool", "content": f"{ROWS}\n\n"}).startswith("turn 3 row 3: ")


def test_an_output_without_rows_answers_its_last_non_empty_line() -> None:
    assert last_printed_line({"role": "tool", "content": "/work\n\n"}) == "/work"
    assert last_printed_line({"role": "tool", "content": ""}) == "(no output)"
