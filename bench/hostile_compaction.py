"""The attacks of issue 41 item 6 for `bench/hostile.py`: sessions continuing one compacted conversation at once.

A long conversation is stored by one `POST /v1/responses` ending in `compaction_trigger` (Codex's remote
compaction: answered with a `compaction` item, no model call, nothing compacted). Then every session sends that
item with a question of its own, all at the same moment, to a model of the issue's size (a 16,384-token window
and 1,024 of output: a 14,540-token budget). Each must compact the whole conversation from nothing. The issue's
run: six continuations of 3,000 messages all got `400 … could not be compacted to fit 14540 tokens in 32 rounds`.

    6-continuations-of-3000-messages          the issue's attack: 3,000 messages of ~130 tokens
    20-continuations-of-1000-long-messages    20 sessions, 1,000 messages of ~380 tokens
    6-continuations-on-postgresql             the first on a PostgreSQL store

`outcome` counts the continuations' statuses (and error codes); `lost/leaked` says how many spans the store holds
and over how many ranges more than one (the same range summarized twice is summarizer work paid twice).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from bench.hostile import REQUEST_TIMEOUT_S, Attack, Outcome, Target, error_code
from bench.hostile_attacks import number

RESPONSES = "/v1/responses"
ISSUE_MODEL = {"context_window": 16_384, "max_output": 1_024}
"""The issue's model: 16,384 - 1,024 - 5 % = a 14,540-token budget."""
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu")
TWICE_SQL = (
    "SELECT COUNT(*) FROM (SELECT 1 FROM summaries GROUP BY start_depth, end_id, strategy HAVING COUNT(*) > 1) AS t"
)


def conversation(messages: int, words: int) -> bytes:
    """A `compaction_trigger` request carrying the whole conversation: what stores it."""
    items: list[Any] = [
        {
            "role": "user" if position % 2 == 0 else "assistant",
            "content": f"message {position}: " + " ".join(WORDS[(position + n) % len(WORDS)] for n in range(words)),
        }
        for position in range(messages)
    ]
    items.append({"type": "compaction_trigger"})
    return json.dumps({"model": "fake", "input": items}).encode()


def continuations(sessions: int, messages: int, words: int) -> Callable[[Target], Outcome]:
    """Store the conversation, then continue it from its `compaction` item in `sessions` sessions at once."""
    body = functools.cache(functools.partial(conversation, messages, words))

    def drive(target: Target) -> Outcome:
        headers = {"content-type": "application/json", "X-Session-Id": "origin"}
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            stored = client.post(target.base + RESPONSES, content=body(), headers=headers)
        if stored.status_code != 200:
            return Outcome(f"storing: {stored.status_code} {error_code(stored.content)}".strip())
        item = stored.json()["output"][0]
        statuses: Counter[str] = Counter()
        start = threading.Barrier(sessions)

        def continue_(session: int) -> None:
            request = {"model": "fake", "input": [item, {"role": "user", "content": f"question {session}"}]}
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
                start.wait()
                try:
                    response = client.post(
                        target.base + RESPONSES, json=request, headers={"X-Session-Id": f"continued-{session}"}
                    )
                    status = f"{response.status_code} {error_code(response.content)}".strip()
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
            statuses[status] += 1

        threads = [threading.Thread(target=continue_, args=(session,)) for session in range(sessions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        outcome = ", ".join(f"{count} × {status}" for status, count in sorted(statuses.items()))
        return Outcome(outcome, spans_written(target))

    drive.prepare = body  # type: ignore[attr-defined]
    return drive


def spans_written(target: Target) -> str:
    if target.postgres is not None:
        spans = int(target.postgres.psql("SELECT COUNT(*) FROM summaries"))
        twice = int(target.postgres.psql(TWICE_SQL))
    else:
        spans = number(target, "SELECT COUNT(*) FROM summaries")
        twice = number(target, TWICE_SQL)
    return f"{spans} spans, {twice} ranges twice"


ATTACKS = (
    Attack("6-continuations-of-3000-messages", continuations(6, 3_000, 120), 41, "6", model=ISSUE_MODEL),
    Attack("20-continuations-of-1000-long-messages", continuations(20, 1_000, 360), 41, "6", model=ISSUE_MODEL),
    Attack("6-continuations-on-postgresql", continuations(6, 3_000, 120), 41, "6", model=ISSUE_MODEL, postgres=True),
)
