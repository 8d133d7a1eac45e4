"""The marathon's fake summarizer keeps the planted `KEY=VALUE` fact of the transcript it is given, as the proxy's
instruction asks a real model to: a fact lost in a marathon is then the proxy's doing, not the fake's."""

from __future__ import annotations

from bench.harness.agents import FACT_KEY, FACT_VALUE
from bench.harness.marathon import marathon_summary
from proxy.compaction.summary_text import summarizer_messages


def test_the_fact_in_the_transcript_is_in_the_summary() -> None:
    turn = {
        "role": "user",
        "content": f"<system-reminder>context</system-reminder>\nRun it. Note: {FACT_KEY}={FACT_VALUE}.",
    }
    prompt = summarizer_messages([turn, {"role": "assistant", "content": "Done."}], 100)

    assert f"{FACT_KEY}={FACT_VALUE}" in (marathon_summary({"messages": prompt}).content or "")


def test_a_transcript_without_the_fact_gets_none() -> None:
    prompt = summarizer_messages([{"role": "user", "content": "Run it."}], 100)

    assert FACT_KEY not in (marathon_summary({"messages": prompt}).content or "")
