"""Pi and OpenCode, installed from npm as they ship (tests/support/client_installs.py, cached under the user's cache
directory; the tests never skip for want of them), through the served proxy on the strict fake: a short tool-using
session. Every turn works, a client's own compaction (Pi's, told a small window) is answered by the proxy with no
model call, the session stays one, and the first turn's fact reaches the model at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.compaction.client_prompts import recognize
from tests.conftest import ServeProxy
from tests.support.client_installs import npm_bin
from tests.support.fake_upstream import FakeUpstream, Reply, content_text

MODEL = "agent-model"
TURNS = 6
TURN_TIMEOUT_S = 300
FACT = "PROJECT_CODENAME=BLUE_HERON_42"
QUESTION = "Which PROJECT_CODENAME did I give you in my first message? Answer with its value only."
COMMAND = re.compile(r"run `([^`]+)`")
FACT_SEEN = re.compile(r"PROJECT_CODENAME=(\w+)")


def prompts() -> list[str]:
    asks = [
        f"Turn {n}: run `seq -f 'turn {n} row %g: alpha beta gamma delta' 1 300` and tell me its last line."
        for n in range(1, TURNS + 1)
    ]
    asks[0] += f" Note: {FACT}."
    return [*asks, QUESTION]


def respond(body: dict[str, Any]) -> Reply:
    """The model: the prompt's command through the `bash` tool, then its output's last line; the fact when asked;
    "OK." to a request offering no `bash` (a client's own side call)."""
    messages = body["messages"]
    if "bash" not in {tool["function"]["name"] for tool in body.get("tools") or []}:
        return Reply(content="OK.")
    last = messages[-1]
    if last["role"] == "tool":
        lines = content_text(last.get("content")).strip().splitlines()
        return Reply(content=f"The last line is: {lines[-1] if lines else '(none)'}")
    text = content_text(last.get("content"))
    if QUESTION in text:
        found = FACT_SEEN.search(json.dumps(messages[:-1]))
        return Reply(content=found.group(1) if found else "unknown")
    command = COMMAND.search(text)
    if command is None:
        return Reply(content="OK.")
    call = {
        "id": f"call_{len(messages)}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command.group(1), "description": "run"})},
    }
    return Reply(tool_calls=[call], finish_reason="tool_calls")


def served(serve_proxy: ServeProxy, fake: FakeUpstream, window: int = 32768) -> str:
    fake.responder = respond
    fake.context_window = window
    model = {"name": MODEL, "model": "openai/fake-model", "api_base": fake.url, "api_key": "k"}
    proxy = serve_proxy(models=[{**model, "context_window": window, "max_output": 4096}], upstream={"timeout_s": 60})
    return proxy.url


def check_session(url: str, fake: FakeUpstream, answers: list[str], compacted: bool) -> None:
    """`compacted`: the client compacted by itself (answered by the proxy)."""
    expected = [f"The last line is: turn {n} row 300: alpha beta gamma delta" for n in range(1, TURNS + 1)]
    assert answers[:-1] == expected
    assert answers[-1].strip() == "BLUE_HERON_42"
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert ('context_proxy_client_compactions_total{kind="summary"}' in metrics) is compacted
    reached = [r for r in fake.requests if recognize(r.body["messages"], bool(r.body.get("tools")))]
    assert reached == []
    assert fake.rejected == []
    assert len(httpx.get(f"{url}/sessions", timeout=10).json()["data"]) == 1


@pytest.mark.parametrize("api", ["openai-completions", "openai-responses", "anthropic-messages"])
def test_pi_compacting_by_itself_stays_one_session(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, api: str
) -> None:
    pi = npm_bin("@earendil-works/pi-coding-agent", "0.74.2", "pi")
    url = served(serve_proxy, fake)
    agent_dir, work = tmp_path / "home" / ".pi" / "agent", tmp_path / "work"
    agent_dir.mkdir(parents=True)
    work.mkdir()
    base = url if api == "anthropic-messages" else f"{url}/v1"
    models = [{"id": MODEL, "contextWindow": 24000, "maxTokens": 4096}]
    provider = {"baseUrl": base, "api": api, "apiKey": "unused", "models": models}
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"proxy": provider}}))
    (agent_dir / "settings.json").write_text(json.dumps({"compaction": {"keepRecentTokens": 3000}}))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"}
    answers = []
    for number, prompt in enumerate(prompts()):
        argv = [str(pi), "--mode", "json", "-p", "--provider", "proxy", "--model", MODEL]
        argv += ["--continue"] if number else []
        done = subprocess.run(
            [*argv, prompt], cwd=work, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        ends = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"type":"agent_end"')]
        last = [m for m in ends[-1]["messages"] if m.get("role") == "assistant"][-1]
        text = "".join(part.get("text", "") for part in last["content"] if part.get("type") == "text")
        answers.append(text or str(last.get("errorMessage")))
    check_session(url, fake, answers, compacted=True)


def test_opencode_runs_a_tool_session_as_one_session(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path
) -> None:
    """Told the model's real window, as it must be: its compaction (`limit.context - limit.output`) then fires
    only past what the proxy sends; its summary request's shape is tests/e2e/test_serialized_compaction_e2e.py's."""
    opencode = npm_bin("opencode-ai", "1.18.33", "opencode")
    url = served(serve_proxy, fake)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    model = {"name": MODEL, "tool_call": True, "limit": {"context": 32768, "output": 4096}}
    provider = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": f"{url}/v1", "apiKey": "unused"}}
    config = {"provider": {"proxy": {**provider, "models": {MODEL: model}}}, "model": f"proxy/{MODEL}"}
    (work / "opencode.json").write_text(json.dumps(config))
    env = {**os.environ, "HOME": str(home), "PWD": str(work), "XDG_CONFIG_HOME": str(home)}
    env["OPENCODE_DISABLE_MODELS_FETCH"] = "1"
    answers = []
    for number, prompt in enumerate(prompts()):
        argv = [str(opencode), "run", "--format", "json", "--auto", "-m", f"proxy/{MODEL}"]
        argv += ["--continue"] if number else []
        done = subprocess.run(
            [*argv, prompt], cwd=work, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        texts = [str((e.get("part") or {}).get("text") or "") for e in events if e.get("type") == "text"]
        answers.append(texts[-1] if texts else "(no text)")
    check_session(url, fake, answers, compacted=False)
