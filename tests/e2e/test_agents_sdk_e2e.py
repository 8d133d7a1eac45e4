"""The openai-agents SDK, as its users run it, against the Responses door: its default model, a function tool, the
Responses API it uses by default.

The SDK needs openai 3.x, which LiteLLM (openai < 3) cannot share an environment with, so it runs in a venv of
its own: `CONTEXT_PROXY_AGENTS_PYTHON` names its interpreter, else one is made (once, cached under the user's
cache directory) with `pip install openai-agents` from the package index. The test never skips for want of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Reply

AGENTS_MODEL = "gpt-5.6-luna"
"""openai-agents' default model (agents/models/default_models.py)."""
VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "context-infinity" / "agents-venv"
INSTALL_TIMEOUT_S = 600

SCRIPT = """
import json, sys
from openai import AsyncOpenAI
from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

set_default_openai_client(AsyncOpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0), use_for_tracing=False)
set_tracing_disabled(True)

@function_tool
def get_weather(city: str) -> str:
    \"\"\"Return the weather for a city.\"\"\"
    return f"Sunny in {city}"

agent = Agent(name="Assistant", instructions="Answer briefly.", tools=[get_weather])
result = Runner.run_sync(agent, "What's the weather in Paris?")
print(json.dumps({"final": result.final_output, "model": agent.model or "default"}))
"""


def agents_python() -> Path:
    named = os.environ.get("CONTEXT_PROXY_AGENTS_PYTHON")
    if named:
        return Path(named)
    python = VENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import agents"], capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=INSTALL_TIMEOUT_S)
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "openai-agents"],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    return python


def test_an_agent_with_a_function_tool_runs_through_the_responses_door(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    python = agents_python()

    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content=f"The tool says: {body['messages'][-1]['content']}")
        call = {
            "id": "call_a1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    fake.responder = respond
    model = {"name": AGENTS_MODEL, "model": "openai/fake-model", "api_base": fake.url, "api_key": "k"}
    proxy = serve_proxy(models=[model])
    done = subprocess.run(
        [python, "-c", SCRIPT, proxy.base_url], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["final"] == "The tool says: Sunny in Paris"
    first, second = (request.body for request in fake.requests)
    assert first["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert first["tools"][0]["function"]["name"] == "get_weather"
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert fake.rejected == []


COMPACTION_SCRIPT = """
import asyncio, json, sys
from openai import AsyncOpenAI
from agents import Agent, Runner, SQLiteSession, function_tool, set_default_openai_client, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession

base_url, model, mode, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
set_default_openai_client(client, use_for_tracing=False)
set_tracing_disabled(True)

@function_tool
def read_note(day: int) -> str:
    \"\"\"Read the note of a day.\"\"\"
    return f"Note of day {day}: the tide was high."

async def main():
    agent = Agent(name="Assistant", instructions="Answer briefly.", tools=[read_note], model=model)
    session = OpenAIResponsesCompactionSession(
        session_id="notes", underlying_session=SQLiteSession("notes"), client=client, model=model,
        compaction_mode=mode,
    )
    failed = []
    for turn in range(turns):
        text = "My locker code is 4417. Read today's note." if turn == 0 else f"Turn {turn}: read the next note."
        try:
            await Runner.run(agent, text, session=session)
        except Exception as exc:
            failed.append(f"{turn}: {type(exc).__name__}: {str(exc)[:300]}")
    items = await session.get_items()
    print(json.dumps({"failed": failed, "compactions": sum(1 for i in items if i.get("type") == "compaction")}))

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["auto", "input", "previous_response_id"])
def test_the_agents_sdks_compaction_session_runs_every_turn_and_keeps_the_first(
    serve_proxy: ServeProxy, fake: FakeUpstream, mode: str
) -> None:
    """Its `OpenAIResponsesCompactionSession` calls `responses.compact` once 10 items are not the user's (turn 4
    on, here): with `previous_response_id` and no input (`auto` after a stored response), or with the whole input."""
    python = agents_python()

    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="Noted.")
        day = len(body["messages"])
        call = {
            "id": f"call_{day}",
            "type": "function",
            "function": {"name": "read_note", "arguments": f'{{"day":{day}}}'},
        }
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    fake.responder = respond
    model = {"name": AGENTS_MODEL, "model": "openai/fake-model", "api_base": fake.url, "api_key": "k"}
    proxy = serve_proxy(models=[model])
    done = subprocess.run(
        [python, "-c", COMPACTION_SCRIPT, proxy.base_url, AGENTS_MODEL, mode, "12"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == []
    assert result["compactions"] >= 1
    # Every request the model got holds the first turn's fact: the compaction item stood for the conversation.
    assert all("4417" in json.dumps(request.body["messages"]) for request in fake.requests)
    assert fake.rejected == []
    sessions = httpx.get(f"{proxy.url}/sessions", timeout=10).json()["data"]
    # In `input` mode the compact request carries the items without the agent's instructions: it is stored on the
    # path of the session whose conversation it starts as, so the whole run is one session.
    assert len(sessions) == 1
