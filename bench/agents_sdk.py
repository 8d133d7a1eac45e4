"""The OpenAI Agents SDK (PyPI `openai-agents`) through the proxy's Responses door: issue 44's long tool-using
session, with the SDK's compaction session as its docs show it (`OpenAIResponsesCompactionSession` over an
`SQLiteSession`), in `--mode` `auto` (its default), `input` or `previous_response_id`.

The SDK needs openai 3.x, which the project's LiteLLM cannot share an environment with, so it runs in a venv of its
own (tests/support/client_installs.py): one child process for the whole session reads a prompt a line from stdin, runs
`Runner.run` with a `shell` function tool, and prints the turn's outcome as a JSON line. The marathon itself (fake
upstream, proxy in its own process, per-turn figures) is bench/harness/marathon.py's.

Run by hand: `python bench/agents_sdk.py --marathon [--mode MODE] [--window N] [--turns N] [--model-latency S]
[--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.marathon import MARATHON_TIMEOUT_S, Agent, TurnRunner, marathon_main, marathon_parser
from tests.support.client_installs import venv_python

REQUIREMENT = "openai-agents==0.24.0"
MODEL = "gpt-5.6-luna"
"""openai-agents' default model: its compaction session takes only OpenAI model names."""
MODES = ("auto", "input", "previous_response_id")

SCRIPT = r"""
import asyncio, json, subprocess, sys
from openai import AsyncOpenAI
from agents import Agent, Runner, SQLiteSession, function_tool, set_default_openai_client, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession

base_url, model, mode, db = sys.argv[1:5]
client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
set_default_openai_client(client, use_for_tracing=False)
set_tracing_disabled(True)

@function_tool
def shell(command: str) -> str:
    '''Run a shell command and return its output.'''
    return subprocess.run(command, shell=True, capture_output=True, text=True).stdout

async def main():
    agent = Agent(name="Assistant", instructions="You are a helpful agent with a shell.", tools=[shell], model=model)
    session = OpenAIResponsesCompactionSession(
        session_id="marathon", underlying_session=SQLiteSession("marathon", db), client=client, model=model,
        compaction_mode=mode,
    )
    for line in sys.stdin:
        try:
            result = await Runner.run(agent, line.rstrip(), session=session, max_turns=20)
            print(json.dumps({"answer": str(result.final_output), "error": False}), flush=True)
        except Exception as exc:
            print(json.dumps({"answer": f"{type(exc).__name__}: {str(exc)[:300]}", "error": True}), flush=True)

asyncio.run(main())
"""


def marathon_agent(args: argparse.Namespace, python: Path) -> Agent:
    def start(proxy_url: str, tmp: Path) -> TurnRunner:
        argv = [str(python), "-c", SCRIPT, f"{proxy_url}/v1", MODEL, args.mode, str(tmp / "session.db")]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp)

        def run_turn(_number: int, prompt: str) -> tuple[int, bool, str]:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.write(prompt.replace("\n", " ") + "\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if not line:
                return child.wait(MARATHON_TIMEOUT_S) or 1, True, "(the SDK's process ended)"
            outcome: dict[str, Any] = json.loads(line)
            return 0, bool(outcome["error"]), str(outcome["answer"])

        return run_turn

    def arguments(command: str, _tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {"command": command}

    return Agent(f"agents-sdk-{args.mode}", [MODEL], "shell", arguments, start)


def main(argv: list[str] | None = None) -> None:
    parser = marathon_parser(__doc__)
    parser.add_argument("--python", type=Path, help=f"an interpreter with {REQUIREMENT} (default: a cached venv)")
    parser.add_argument("--mode", choices=MODES, default=MODES[0], help="the compaction session's compaction_mode")
    args = parser.parse_args(argv)
    if not args.marathon:
        parser.error("only --marathon is implemented for the Agents SDK")
    python = args.python or venv_python("agents", REQUIREMENT, "agents")
    marathon_main(args, marathon_agent(args, python), {"python": str(python)})


if __name__ == "__main__":
    main()
