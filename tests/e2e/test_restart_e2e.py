"""A restart between two requests of one session: two proxy processes, one after the other, over one SQLite file.

What a process keeps between requests is a cache (docs/architecture.md, "Rules"), and yet only the recent paths
recognize a node a client re-sends in another form than it was stored in (a masked tool output, its opening turn left
out: Gemini CLI 0.61.0 resumed). The first request after a restart must land where it would have without one: the
same session, the same stored nodes, the same prompt upstream (`proxy.history.warming`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import proxy_server
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyProcess, make_config

pytestmark = pytest.mark.slow

PROCESS_START_TIMEOUT_S = 180.0
"""A process imports LiteLLM (seconds of CPU); four start one after another on a busy machine."""

MASK = "<tool_output_masked>\nline 1\n\nOutput too large. Full output available at: /tmp/out.txt\n</tool_output_masked>"


def opened(*, masked: bool, left_out: bool, turns: int) -> list[dict[str, Any]]:
    """A tool-using session as the client holds it after `turns` turns (each answered "ok" by the fake)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "build"}'}}
    output = MASK if masked else "line of build output\n" * 300
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    if not left_out:
        messages.append({"role": "user", "content": "Run the build. Note: CODE=42"})
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]
    for turn in range(2, turns + 1):
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"Turn {turn}"}]
    return messages


def run(tmp: Path, fake: FakeUpstream, restart: bool) -> list[dict[str, Any]]:
    """Three requests (the third masking the output and leaving out the opening turn), with the proxy restarted
    before the third when `restart`; the upstream's messages of the third, and the store's sessions."""
    tmp.mkdir()
    raw = make_config(tmp, fake.url)
    requests = [
        opened(masked=False, left_out=False, turns=1),
        opened(masked=False, left_out=False, turns=2),
        opened(masked=True, left_out=True, turns=3),
    ]
    proxy = ProxyProcess(raw, tmp)
    proxy.start()
    try:
        for number, messages in enumerate(requests):
            if restart and number == len(requests) - 1:
                proxy.stop()
                proxy = ProxyProcess(raw, tmp)
                proxy.start()
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=30)
            client.chat.completions.create(model="fake", messages=messages)  # type: ignore[arg-type]
        sessions = httpx.get(f"{proxy.url}/sessions", timeout=30).json()["data"]
    finally:
        proxy.stop()
    assert len(sessions) == 1
    assert sessions[0]["message_count"] == len(requests[1]) + 3  # every message once, the left-out turn in place
    return list(fake.requests[-1].body["messages"])


def test_the_first_request_after_a_restart_lands_where_it_would_have_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy_server, "START_TIMEOUT_S", PROCESS_START_TIMEOUT_S)
    with FakeUpstream() as fake:
        fake.responder = lambda body: Reply(content="ok")
        without = run(tmp_path / "without", fake, restart=False)
        fake.requests.clear()
        fake.prompt_cache.clear()
        with_restart = run(tmp_path / "with", fake, restart=True)
    assert with_restart == without
    assert any("CODE=42" in str(message.get("content")) for message in with_restart)
