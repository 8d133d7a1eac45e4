from __future__ import annotations
import asyncio, traceback
from proxy.config import ModelEntry, UpstreamConfig
from proxy.forward import Upstream
import litellm
from tests.fake_upstream import FakeUpstream, Fault

async def test_probe(fake: FakeUpstream) -> None:
    entry = ModelEntry("fake", "openai/fake-model", fake.url, "k", 8192, 1024)
    up = Upstream(UpstreamConfig(timeout_s=10), (entry,))
    fake.fail_next(Fault(drop_after_chunks=2))
    w = await litellm.acompletion(**up._kwargs(entry, [{"role": "user", "content": "a b c"}], {"stream": True}, stream=True))
    if w.completion_stream is None:
        await w.fetch_stream()
    cs = w.completion_stream
    print(type(w), type(cs), getattr(cs, "streaming_response", None))
    await asyncio.sleep(0.05)
    try:
        async for c in cs:
            print("chunk", c)
    except Exception:
        traceback.print_exc()
