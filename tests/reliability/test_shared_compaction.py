"""Sessions continuing one compacted conversation at once (issue 41 item 6), through the served proxy.

A long conversation is stored by a Responses request ending in `compaction_trigger` (Codex's remote
compaction: no model call, nothing compacted), and its `compaction` item is then sent by several sessions at the
same moment, each with a question of its own, to a native Responses model with a small window. Each of them must
compact the whole conversation from nothing: about 40 spans (first summaries of what the summarizer reads at once,
then merges). All are answered, the prompts the upstream got fit its window, and each range is summarized once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import read_only
from tests.support.fake_responses_upstream import FakeResponsesUpstream

WINDOW = 2_048
MESSAGES = 800
"""~50,000 tokens: ~40 first summaries of the ~1,300 tokens the model reads at once, then merges."""
SESSIONS = 6
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda")


@pytest.fixture
def native() -> Iterator[FakeResponsesUpstream]:
    with FakeResponsesUpstream(context_window=WINDOW) as upstream:
        yield upstream


def message(position: int) -> dict[str, Any]:
    text = f"message {position}: " + " ".join(WORDS[(position + n) % len(WORDS)] for n in range(60))
    return {"role": "user" if position % 2 == 0 else "assistant", "content": text}


@pytest.mark.time_budget(180)
async def test_sessions_continuing_one_compaction_item_at_once_are_all_answered(
    serve_proxy: ServeProxy, native: FakeResponsesUpstream, tmp_path: Path
) -> None:
    model = {
        "name": "native",
        "model": "openai/fake-model",
        "api_base": native.url,
        "api_key": "sk-native",
        "context_window": WINDOW,
        "max_output": 256,
        "api": "responses",
    }
    proxy = serve_proxy(models=[model])
    conversation = [message(position) for position in range(MESSAGES)]
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=150) as sdk:
        compacted = await sdk.responses.create(
            model="native",
            input=[*conversation, {"type": "compaction_trigger"}],  # type: ignore[list-item]
            extra_headers={"X-Session-Id": "origin"},
        )
        [item] = compacted.output
        assert item.type == "compaction"
        assert native.requests == []
        item_param = item.model_dump(exclude_none=True)

        answers = await asyncio.gather(
            *(
                sdk.responses.create(
                    model="native",
                    input=[item_param, {"role": "user", "content": f"question {number}: where were we?"}],
                    extra_headers={"X-Session-Id": f"continued-{number}"},
                )
                for number in range(SESSIONS)
            ),
            return_exceptions=True,
        )

    failed = [answer for answer in answers if isinstance(answer, BaseException)]
    assert failed == []
    answered = [request for request in native.requests if "question" in str(request.body["input"][-1])]
    assert len(answered) == SESSIONS
    assert native.rejected == []  # every prompt fitted the window
    with read_only(tmp_path / "store.db") as db:
        ranges = db.execute("SELECT start_depth, end_id, strategy, COUNT(*) FROM summaries GROUP BY 1, 2, 3").fetchall()
    assert len(ranges) > 32
    assert max(row[3] for row in ranges) == 1  # each range summarized once, whichever session needed it
