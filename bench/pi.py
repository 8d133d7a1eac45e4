"""Pi (npm `@earendil-works/pi-coding-agent`) through the proxy: issue 44's long tool-using session.

Each turn runs `pi --mode json -p [--continue] --provider proxy --model pi-model PROMPT` in a scratch folder whose
`models.json` (`PI_CODING_AGENT_DIR`) points Pi at the proxy with `--api`: `openai-completions` (chat),
`openai-responses` or `anthropic-messages`; the window Pi is told is the model's (`--window`), so Pi's own
compaction (past window - 16,384 tokens, its `reserveTokens`) runs as it ships and is answered by the proxy.
The marathon itself (fake upstream, proxy in its own process, per-turn figures) is bench/harness/marathon.py's.

Run by hand: `python bench/pi.py --marathon [--api API] [--window N] [--turns N] [--model-latency S]
[--tool-output-tokens N] [--json PATH]`. Pi is installed from npm into the user's cache on first use.
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

PACKAGE, VERSION = "@earendil-works/pi-coding-agent", "0.74.2"
MODEL = "pi-model"
MAX_OUTPUT = 4096
APIS = ("openai-completions", "openai-responses", "anthropic-messages")


def models_json(proxy_url: str, api: str, window: int) -> dict[str, Any]:
    """Pi's `models.json`: one provider at the proxy (the Anthropic SDK adds `/v1` itself)."""
    base = proxy_url if api == "anthropic-messages" else f"{proxy_url}/v1"
    model = {"id": MODEL, "contextWindow": window, "maxTokens": MAX_OUTPUT}
    return {"providers": {"proxy": {"baseUrl": base, "api": api, "apiKey": "unused", "models": [model]}}}


def answer_of(events: list[dict[str, Any]]) -> tuple[str, bool]:
    """The last assistant message's text, and whether Pi ended the turn with an error."""
    for event in reversed(events):
        if event.get("type") != "agent_end":
            continue
        messages = [m for m in event.get("messages") or [] if m.get("role") == "assistant"]
        if not messages:
            return "(no answer)", True
        last = messages[-1]
        text = "".join(part.get("text", "") for part in last.get("content") or [] if part.get("type") == "text")
        return text or str(last.get("errorMessage") or "(no text)"), last.get("stopReason") == "error"
    return "(no agent_end)", True


def marathon_agent(args: argparse.Namespace, pi: Path) -> Agent:
    def start(proxy_url: str, tmp: Path) -> TurnRunner:
        workdir, home = tmp / "work", tmp / "home"
        agent_dir = home / ".pi" / "agent"
        workdir.mkdir()
        agent_dir.mkdir(parents=True)
        (agent_dir / "models.json").write_text(json.dumps(models_json(proxy_url, args.api, args.window)))
        env = {**os.environ, "HOME": str(home), "PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"}

        def run_turn(number: int, prompt: str) -> tuple[int, bool, str]:
            argv = [str(pi), "--mode", "json", "-p", "--provider", "proxy", "--model", MODEL]
            run = run_cli([*argv, *(["--continue"] if number > 1 else []), prompt], workdir, env, MARATHON_TIMEOUT_S)
            answer, error = answer_of(run.events)
            if run.exit_code != 0 and not error:
                answer = f"(exit {run.exit_code}) {run.stderr[-300:]}"
            return run.exit_code, error, answer

        return run_turn

    def arguments(command: str, _tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {"command": command}

    return Agent(f"pi-{args.api}", [MODEL], "bash", arguments, start, max_output=MAX_OUTPUT)


def main(argv: list[str] | None = None) -> None:
    parser = marathon_parser(__doc__)
    parser.add_argument("--pi", type=Path, help=f"the pi executable (default: {PACKAGE}@{VERSION} from npm)")
    parser.add_argument("--api", choices=APIS, default=APIS[0], help="the API Pi speaks to the proxy")
    args = parser.parse_args(argv)
    if not args.marathon:
        parser.error("only --marathon is implemented for Pi")
    pi = args.pi or npm_bin(PACKAGE, VERSION, "pi")
    marathon_main(args, marathon_agent(args, pi), {"cli": f"{pi} ({PACKAGE}@{VERSION})"})


if __name__ == "__main__":
    main()
