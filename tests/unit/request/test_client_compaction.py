"""`proxy.request.client_compaction`: the summary a client's own compaction request is answered with is written
off the event loop when the turns it reads are long (it counts tokens line by line), and is the same text."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from proxy.history.messages import StoredMessage
from proxy.request import client_compaction
from proxy.request.client_compaction import summary_off_loop, summary_text

LONG_OUTPUT = "\n".join(f"row {row}: alpha beta gamma delta epsilon zeta eta theta" for row in range(2_000))


def path_of(messages: list[dict[str, Any]]) -> list[StoredMessage]:
    return [
        StoredMessage(f"m{depth}", f"m{depth - 1}" if depth else None, depth, str(message["role"]), message, 10, 0.0)
        for depth, message in enumerate(messages)
    ]


def session(outputs: str) -> list[StoredMessage]:
    call = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "seq"}'}}
    return path_of(
        [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": outputs},
            {"role": "assistant", "content": "done"},
        ]
    )


@pytest.mark.parametrize(("output", "off_loop"), [("row 1: ok", False), (LONG_OUTPUT, True)])
async def test_a_long_session_is_summarized_in_a_worker_thread(
    output: str, off_loop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []

    def recorded(path: Sequence[StoredMessage], spans: Any, end_id: str, tagged: bool) -> str:
        threads.append(threading.current_thread())
        return summary_text(path, spans, end_id, tagged)

    monkeypatch.setattr(client_compaction, "summary_text", recorded)
    path = session(output)

    text = await summary_off_loop(path, [], "m3", tagged=False)

    assert text == summary_text(path, [], "m3", tagged=False)
    assert (threads[0] is not threading.main_thread()) is off_loop
