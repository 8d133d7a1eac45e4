"""Gemini CLI, as its users run it, against the Gemini door: a short tool-using session of a few turns.

`@google/gemini-cli` (`GEMINI_CLI_VERSION`, from npm) runs headless (`gemini -p ... --yolo -o json`) under a
scratch HOME whose `~/.gemini/settings.json` selects the `gemini-api-key` auth, with `GOOGLE_GEMINI_BASE_URL` at
the proxy and `GEMINI_CLI_TRUST_WORKSPACE=true`; the turns after the first resume its session (`--resume
latest`). The strict fake upstream plays the model: on a prompt it runs `ls -la` with Gemini CLI's shell tool,
on that result it writes the file the prompt names with its `write_file` tool, then says so; asked last for a fact
given in the first prompt, it answers with what it finds in the conversation it was sent. Each resumed process
opens with a new `<session_context>` (the directory tree has grown) and repeats each function response: the
proxy still holds one session, one path, every message once. `CONTEXT_PROXY_GEMINI_CLI`
names the `gemini` executable, else the pinned version is installed once under the user's cache directory with
`npm install`. The test never skips for want of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Reply, content_text

GEMINI_CLI_VERSION = "0.61.0"
INSTALL_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "context-infinity" / "gemini-cli"
INSTALL_TIMEOUT_S = 600
TURN_TIMEOUT_S = 240
MODEL = "fake"
WINDOW = 32_768
"""Gemini CLI's system prompt and tools are ~6k tokens."""
FACT = "PROJECT_CODENAME=BLUE_HERON_42"
FACT_QUESTION = "Which PROJECT_CODENAME did I give you in my first message? Answer with its value only."
FILE_NAME = re.compile(r"create ([\w-]+\.txt)")


def gemini_cli() -> Path:
    named = os.environ.get("CONTEXT_PROXY_GEMINI_CLI")
    if named:
        return Path(named)
    executable = INSTALL_DIR / "node_modules" / ".bin" / "gemini"
    installed = INSTALL_DIR / "node_modules" / "@google" / "gemini-cli" / "package.json"
    if not (executable.exists() and json.loads(installed.read_text())["version"] == GEMINI_CLI_VERSION):
        INSTALL_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(INSTALL_DIR),
                "--no-audit",
                "--no-fund",
                f"@google/gemini-cli@{GEMINI_CLI_VERSION}",
            ],
            check=True,
            capture_output=True,
            timeout=INSTALL_TIMEOUT_S,
        )
    return executable


class Script:
    """The model's side: `ls -la`, then `write_file` of the file the latest prompt names, then "Done"."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages: list[dict[str, Any]] = body["messages"]
        last = messages[-1]
        if last["role"] == "user" and FACT_QUESTION in content_text(last.get("content")):
            found = re.search(
                r"PROJECT_CODENAME=(\w+)", " ".join(content_text(m.get("content")) for m in messages[:-1])
            )
            return Reply(content=found.group(1) if found else "I do not know.")
        if last["role"] == "user":
            return self._call("run_shell_command", {"command": "ls -la", "description": "List the files."})
        called = self._called(messages, last.get("tool_call_id"))
        if called == "run_shell_command":
            return self._call("write_file", {"file_path": self._target(messages), "content": "hello from the proxy\n"})
        return Reply(content=f"Done: created {self._target(messages)}.")

    def _call(self, name: str, arguments: dict[str, Any]) -> Reply:
        self.calls += 1
        call = {
            "id": f"call_g{self.calls}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    @staticmethod
    def _called(messages: list[dict[str, Any]], call_id: Any) -> str:
        for message in messages:
            for call in message.get("tool_calls") or ():
                if call.get("id") == call_id:
                    return str(call["function"]["name"])
        return ""

    @staticmethod
    def _target(messages: list[dict[str, Any]]) -> str:
        for message in reversed(messages):
            if message["role"] == "user":
                named = FILE_NAME.search(content_text(message.get("content")))
                if named:
                    return named.group(1)
        return "unnamed.txt"


def run_turn(cli: Path, prompt: str, workdir: Path, env: dict[str, str], *, resume: bool) -> dict[str, Any]:
    argv = [str(cli), "-m", MODEL, "-p", prompt, "--yolo", "-o", "json", *(["--resume", "latest"] if resume else [])]
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GEMINI_API_KEY": "unused",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "NO_COLOR": "1",
    }


def test_a_tool_using_session_of_several_resumed_turns_is_one_session_holding_every_message(
    serve_proxy: ServeProxy, fake: FakeUpstream, cli_env: dict[str, str], tmp_path: Path
) -> None:
    cli = gemini_cli()
    fake.responder = Script()
    fake.context_window = WINDOW
    model = {"name": MODEL, "model": "openai/fake-model", "api_base": fake.url, "api_key": "sk-upstream-secret"}
    proxy = serve_proxy(models=[{**model, "context_window": WINDOW, "max_output": 4096}])
    env = {**cli_env, "GOOGLE_GEMINI_BASE_URL": proxy.url}
    workdir = tmp_path / "work"
    workdir.mkdir()
    prompts = [f"List the files here, then create hello.txt. Note: {FACT}.", "Now create second.txt as well."]
    for turn, prompt in enumerate(prompts):
        result = run_turn(cli, prompt, workdir, env, resume=turn > 0)
        target = FILE_NAME.search(prompt)
        assert target is not None
        assert result["response"] == f"Done: created {target.group(1)}."
        assert (workdir / target.group(1)).read_text() == "hello from the proxy\n"
    answer = run_turn(cli, FACT_QUESTION, workdir, env, resume=True)
    assert answer["response"] == "BLUE_HERON_42"
    assert fake.rejected == []
    roles = [message["role"] for message in fake.requests[-1].body["messages"]]
    assert roles.count("tool") == 4
    assert all(request.body["model"] == "fake-model" for request in fake.requests)
    listed = httpx.get(f"{proxy.url}/sessions", timeout=10).json()["data"]
    assert len(listed) == 1, listed
    journal = httpx.get(f"{proxy.url}/journal", timeout=10).json()["data"]
    assert {step["status"] for step in journal} == {"sealed"}
    assert len(journal) == len(fake.requests) == 7
    stored = httpx.get(f"{proxy.url}/sessions/{listed[0]['id']}", timeout=10).json()["messages"]
    turn = ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [message["role"] for message in stored] == ["system", "system", *turn, *turn, "user", "assistant"]


GEMINI_2_MODEL = "gemini-2.5-flash"
"""A name Gemini CLI treats as a Gemini 2 model: it then merges consecutive turns of one role in its history."""
FLOOD_CALLS = 11
FLOOD_COMMAND = "seq -f 'row %g of print {n}: alpha beta gamma delta' 1 900"
"""~36k characters (~9k tokens by Gemini CLI's estimate): under its 40k-character truncation, and eleven of them
pass the ~80k tokens of tool outputs past which it masks the older ones (`ToolOutputMaskingService`)."""
LARGE_WINDOW = 400_000


class Flood:
    """The model's side: on a prompt, `FLOOD_CALLS` shell calls in a row printing `FLOOD_COMMAND` (each its own:
    Gemini CLI stops a loop of the same call), then "Done."; asked for the fact, what it finds in the conversation
    it was sent."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages: list[dict[str, Any]] = body["messages"]
        last = messages[-1]
        if last["role"] == "user" and FACT_QUESTION in content_text(last.get("content")):
            found = re.search(
                r"PROJECT_CODENAME=(\w+)", " ".join(content_text(m.get("content")) for m in messages[:-1])
            )
            return Reply(content=found.group(1) if found else "I do not know.")
        prompt = max(i for i, message in enumerate(messages) if message["role"] == "user")
        if sum(message["role"] == "tool" for message in messages[prompt:]) >= FLOOD_CALLS:
            return Reply(content="Done.")
        self.calls += 1
        arguments = {"command": FLOOD_COMMAND.format(n=self.calls), "description": "Print rows."}
        call = {
            "id": f"call_f{self.calls}",
            "type": "function",
            "function": {"name": "run_shell_command", "arguments": json.dumps(arguments)},
        }
        return Reply(tool_calls=[call], finish_reason="tool_calls")


def test_a_session_whose_client_masked_its_outputs_and_lost_its_first_turn_stays_one_holding_that_turn(
    serve_proxy: ServeProxy, fake: FakeUpstream, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Past ~80k tokens of tool outputs Gemini CLI masks the older ones in its own history; a Gemini 2 model's
    history has its first user turn merged into the `<session_context>` turn by then, so the session it resumes
    afterwards has lost that turn (it skips `<session_context>` turns). The proxy still holds one session, puts the
    turn back in its place, and the fact given there is answered."""
    cli = gemini_cli()
    fake.responder = Flood()
    fake.context_window = LARGE_WINDOW
    model = {"name": GEMINI_2_MODEL, "model": "openai/fake-model", "api_base": fake.url, "api_key": "sk-upstream"}
    proxy = serve_proxy(models=[{**model, "context_window": LARGE_WINDOW, "max_output": 4096}])
    env = {**cli_env, "GOOGLE_GEMINI_BASE_URL": proxy.url}
    workdir = tmp_path / "work"
    workdir.mkdir()

    def turn(prompt: str, resume: bool) -> dict[str, Any]:
        argv = [str(cli), "-m", GEMINI_2_MODEL, "-p", prompt, "--yolo", "-o", "json"]
        argv += ["--resume", "latest"] if resume else []
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-2000:]
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    assert turn(f"Print the rows a few times. Note: {FACT}.", resume=False)["response"] == "Done."
    first_process = [request.body["messages"] for request in fake.requests]
    assert any("<tool_output_masked>" in content_text(m.get("content")) for m in first_process[-1])
    assert turn("Print them again.", resume=True)["response"] == "Done."
    resumed = fake.requests[len(first_process)].body["messages"]
    assert resumed[2]["content"].startswith("Print the rows a few times.")  # the turn Gemini CLI no longer sent
    answer = turn(FACT_QUESTION, resume=True)
    assert answer["response"] == "BLUE_HERON_42"
    assert fake.rejected == []
    listed = httpx.get(f"{proxy.url}/sessions", timeout=10).json()["data"]
    assert len(listed) == 1, listed
    stored = httpx.get(f"{proxy.url}/sessions/{listed[0]['id']}", timeout=10).json()["messages"]
    assert [message["role"] for message in stored].count("user") == 3
