"""OpenCode (npm `opencode-ai`) through the proxy: issue 44's long tool-using session.

Each turn runs `opencode run --format json --auto [--continue] -m proxy/oc-model PROMPT` in a scratch folder whose
`opencode.json` points OpenCode at the proxy with `--sdk`: `@ai-sdk/openai-compatible` (chat completions) or
`@ai-sdk/openai` (Responses). The model's `limit` is the real one (`--window`, 4,096 output), so OpenCode's own
compaction (past `limit.context - limit.output`) runs as it ships and is answered by the proxy. The marathon itself
is bench/harness/marathon.py's.

Run by hand: `python bench/opencode.py --marathon [--sdk SDK] [--window N] [--turns N] [--model-latency S]
[--json PATH]`. OpenCode is installed from npm into the user's cache on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.agents import run_cli
from bench.harness.marathon import MARATHON_TIMEOUT_S, Agent, TurnRunner, marathon_main, marathon_parser
from tests.support.client_installs import npm_bin

PACKAGE, VERSION = "opencode-ai", "1.18.33"
MODEL = "oc-model"
MAX_OUTPUT = 4096
SDKS = ("@ai-sdk/openai-compatible", "@ai-sdk/openai")


def opencode_json(proxy_url: str, sdk: str, window: int) -> dict[str, Any]:
    model = {"name": MODEL, "tool_call": True, "limit": {"context": window, "output": MAX_OUTPUT}}
    provider = {
        "npm": sdk,
        "name": "Context Infinity",
        "options": {"baseURL": f"{proxy_url}/v1", "apiKey": "unused"},
        "models": {MODEL: model},
    }
    return {"$schema": "https://opencode.ai/config.json", "provider": {"proxy": provider}, "model": f"proxy/{MODEL}"}


def answer_of(events: list[dict[str, Any]]) -> tuple[str, bool]:
    """The last text OpenCode printed, and whether it reported an error."""
    texts = [str((event.get("part") or {}).get("text") or "") for event in events if event.get("type") == "text"]
    errors = [event for event in events if event.get("type") == "error"]
    if errors:
        return json.dumps(errors[-1])[:300], True
    return (texts[-1] if texts else "(no text)"), not texts


def marathon_agent(args: argparse.Namespace, opencode: Path) -> Agent:
    def start(proxy_url: str, tmp: Path) -> TurnRunner:
        workdir, home = tmp / "work", tmp / "home"
        workdir.mkdir()
        home.mkdir()
        (workdir / "opencode.json").write_text(json.dumps(opencode_json(proxy_url, args.sdk, args.window)))
        env = {**os.environ, "HOME": str(home), "PWD": str(workdir), "OPENCODE_DISABLE_MODELS_FETCH": "1"}
        env["XDG_CONFIG_HOME"] = str(home)

        def run_turn(number: int, prompt: str) -> tuple[int, bool, str]:
            argv = [str(opencode), "run", "--format", "json", "--auto", "-m", f"proxy/{MODEL}"]
            run = run_cli([*argv, *(["--continue"] if number > 1 else []), prompt], workdir, env, MARATHON_TIMEOUT_S)
            answer, error = answer_of(run.events)
            if run.exit_code != 0 or error:
                answer = f"{answer} (exit {run.exit_code}) {run.stderr[-300:]}"
            return run.exit_code, error, answer

        return run_turn

    def arguments(command: str, _tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {"command": command, "description": "Run the command"}

    return Agent(f"opencode-{args.sdk.rsplit('/', 1)[-1]}", [MODEL], "bash", arguments, start, max_output=MAX_OUTPUT)


def main(argv: list[str] | None = None) -> None:
    parser = marathon_parser(__doc__)
    parser.add_argument("--opencode", type=Path, help=f"the opencode executable (default: {PACKAGE}@{VERSION})")
    parser.add_argument("--sdk", choices=SDKS, default=SDKS[0], help="the AI SDK provider OpenCode uses")
    args = parser.parse_args(argv)
    if not args.marathon:
        parser.error("only --marathon is implemented for OpenCode")
    opencode = args.opencode or npm_bin(PACKAGE, VERSION, "opencode")
    marathon_main(args, marathon_agent(args, opencode), {"cli": f"{opencode} ({PACKAGE}@{VERSION})"})


if __name__ == "__main__":
    main()
