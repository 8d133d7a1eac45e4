"""What a translated provider's call costs in-process: the proxy's route against `litellm.acompletion`.

Run by hand: `python bench/translated.py [--calls 200] [--messages 10]`. One fake Anthropic upstream
(tests/support, real HTTP on 127.0.0.1); an `anthropic/` model entry; calls alternating between the two routes in
every round so that they share the machine's noise:

    acompletion   litellm.acompletion with the keyword parameters the proxy used to pass it
    translated    LiteLLMUpstream.complete / open_stream: LiteLLM's provider config (and, for a stream, its
                  Anthropic event iterator), posted on the proxy's pooled client

Prints p50/p95 wall time and p50 CPU time per call, a whole answer and a stream read to its end (the fake's own
time included in both: it serves from a thread of this process), and the ratios translated/acompletion.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy import environment
from proxy.config.models import ModelEntry
from proxy.config.schema import UpstreamConfig
from proxy.upstream.litellm_client import LiteLLMUpstream
from proxy.upstream.protocol import UpstreamCall
from tests.support.fake_anthropic_upstream import FakeAnthropicUpstream

KEY = "sk-ant-bench"


def history(count: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for index in range(count - 1):
        role = "user" if index % 2 == 0 else "assistant"
        turns.append({"role": role, "content": f"turn {index}: " + "words of the conversation " * 30})
    return [*turns, {"role": "user", "content": "and now?"}]


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


async def run(calls: int, count: int) -> None:
    litellm = environment.litellm()
    with FakeAnthropicUpstream(context_window=1_000_000) as native:
        entry = ModelEntry("claude", "anthropic/claude-fake", native.url, KEY, 1_000_000, 1024)
        upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=30), (entry,))
        messages = history(count)
        params = {"max_tokens": 64}
        streamed = {**params, "stream_options": {"include_usage": True}}

        async def translated() -> None:
            await upstream.complete(UpstreamCall(entry, messages, params))

        async def acompletion() -> None:
            await litellm.acompletion(model=entry.model, messages=messages, api_base=native.url, api_key=KEY, **params)

        async def translated_stream() -> None:
            async for _chunk in await upstream.open_stream(UpstreamCall(entry, messages, streamed)):
                pass

        async def acompletion_stream() -> None:
            wrapper = await litellm.acompletion(
                model=entry.model, messages=messages, api_base=native.url, api_key=KEY, stream=True, **streamed
            )
            async for _chunk in wrapper:
                pass

        targets = {
            "acompletion": acompletion,
            "translated": translated,
            "acompletion stream": acompletion_stream,
            "translated stream": translated_stream,
        }
        times: dict[str, list[float]] = {name: [] for name in targets}
        cpu: dict[str, list[float]] = {name: [] for name in targets}
        for call in targets.values():  # warm both: imports, pools
            for _ in range(5):
                await call()
        for round_index in range(calls):
            order = list(targets.items())
            if round_index % 2:
                order.reverse()
            for name, call in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                await call()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
        await upstream.aclose()
        await environment.close_loop_clients(litellm)
    print(f"{count} messages, {calls} calls per route")
    print(f"{'route':<20} {'p50 ms':>8} {'p95 ms':>8} {'p50 ratio':>10} {'CPU p50 ms':>11} {'CPU ratio':>10}")
    for name, values in times.items():
        base = name.replace("translated", "acompletion")
        median, cpu_median = statistics.median(values), statistics.median(cpu[name])
        print(
            f"{name:<20} {median * 1000:8.2f} {p95(values) * 1000:8.2f} {median / statistics.median(times[base]):10.2f}"
            f" {cpu_median * 1000:11.2f} {cpu_median / statistics.median(cpu[base]):10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--messages", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(run(args.calls, args.messages))


if __name__ == "__main__":
    main()
