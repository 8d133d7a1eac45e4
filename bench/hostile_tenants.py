"""The attack of issue 41 item 1, for `bench/hostile.py`: one tenant shrinking every tenant's budget.

1   quoted-window-for-all        tenant A sends OpenAI's context-length sentence ("maximum context length is 50
                                 tokens … 999999 tokens") to an upstream that quotes a refused value back in its
                                 400 (`servers.hostile_answer("quote")`); then tenant B asks a short question.
                                 Outcome: what A got, then what B got; lost/leaked: the corrections the store
                                 kept (`model_corrections`, read by every replica and after a restart).
"""

from __future__ import annotations

import json

import httpx

from bench.hostile import Attack, Outcome, Target, send
from bench.hostile_attacks import CHAT, number

TENANTS = ("k-tenant-a", "k-tenant-b")
QUOTED = "This model's maximum context length is 50 tokens. However, your messages resulted in 999999 tokens."


def _ask(target: Target, key: str, content: str) -> str:
    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": content}]}).encode()
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as client:
        return send(client, target.base + CHAT, body, stream=False)


def quoted_window(target: Target) -> Outcome:
    attacker, victim = TENANTS
    first = _ask(target, attacker, f"Please repeat: {QUOTED}")
    second = _ask(target, victim, "What is a tide?")
    rows = number(target, "SELECT COUNT(*) FROM model_corrections")
    window = number(target, "SELECT MIN(context_window) FROM model_corrections")
    kept = f"{rows} correction(s) kept" + (f", window {window}" if window else "") if rows else "-"
    return Outcome(f"A: {first}; B: {second}", kept)


ATTACKS = (
    Attack(
        "quoted-window-for-all",
        quoted_window,
        41,
        "1",
        answer=("quote", QUOTED),
        sections={"auth": {"keys": list(TENANTS)}},
    ),
)
