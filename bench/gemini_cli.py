"""The real Gemini CLI through the Gemini door: issue 27's long tool-using session (bench/harness/marathon.py).

`gemini` (`@google/gemini-cli`, 0.61.0 tested) runs headless, one process a turn: `gemini -m MODEL -p PROMPT
--yolo -o json`, the turns after the first with `--resume latest`, under a scratch HOME whose
`~/.gemini/settings.json` selects the `gemini-api-key` auth, with `GOOGLE_GEMINI_BASE_URL` at the proxy (in its
own process) and `GEMINI_CLI_TRUST_WORKSPACE=true`. Each turn the scripted model calls Gemini CLI's shell tool
(`run_shell_command`) with a command printing ~`--tool-output-tokens` tokens, then answers with its last line;
the first turn gives a fact the last one asks for. Reported per turn and in total by the marathon's report:
failed turns, summarizer calls, the sessions the proxy holds, the cached share of the main model's input.

Run by hand: `python bench/gemini_cli.py [--gemini PATH] [--window N] [--turns N] [--keep] [--json PATH]
[--marathon] [--model-latency S] [--summarizer-latency S] [--tool-output-tokens N]`; `--marathon` means 100
turns unless `--turns` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.agents import CliRun, find_cli, run_cli
from bench.harness.marathon import MARATHON_TIMEOUT_S, Agent, TurnRunner, add_marathon_options, run_marathon
from bench.harness.report import Report, add_json_option

MODEL = "gemini-2.5-pro"
"""The name Gemini CLI is given (`-m`): configured on the proxy as the fake main model."""
DEFAULT_WINDOW = 32_768
DEFAULT_TURNS = 10
MARATHON_TURNS = 100
DEFAULT_GEMINI_PATHS = (
    Path.home() / ".cache" / "context-infinity" / "gemini-cli" / "node_modules" / ".bin" / "gemini",
    Path("/tmp/gemini-cli-npm/node_modules/.bin/gemini"),
)
INSTALL = "npm install --prefix ~/.cache/context-infinity/gemini-cli @google/gemini-cli@0.61.0"
SHELL_TOOL = "run_shell_command"


def gemini_env(home: Path, proxy_url: str) -> dict[str, str]:
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "GOOGLE_GEMINI_BASE_URL": proxy_url,
        "GEMINI_API_KEY": "unused",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "NO_COLOR": "1",
    }


def outcome(run: CliRun) -> dict[str, Any]:
    """`-o json`'s one object (printed over several lines), or `{}` when the turn printed none."""
    text = "\n".join(event.get("text", json.dumps(event)) for event in run.events)
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def marathon_agent(gemini: list[str]) -> Agent:
    """Gemini CLI for the marathon: one `gemini -p` a turn, the later ones resuming the session."""

    def start(proxy_url: str, tmp: Path) -> TurnRunner:
        workdir = tmp / "work"
        workdir.mkdir()
        env = gemini_env(tmp / "home", proxy_url)

        def run_turn(number: int, prompt: str) -> tuple[int, bool, str]:
            argv = [*gemini, "-m", MODEL, "-p", prompt, "--yolo", "-o", "json"]
            run = run_cli([*argv, *(["--resume", "latest"] if number > 1 else [])], workdir, env, MARATHON_TIMEOUT_S)
            result = outcome(run)
            answer = str(result.get("response") or f"(no response; exit {run.exit_code}) {run.stderr[-200:]}")
            return run.exit_code, "error" in result or not result, answer

        return run_turn

    def arguments(command: str, _tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {"command": command, "description": "Run the command"}

    return Agent("gemini", (MODEL,), SHELL_TOOL, arguments, start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--gemini", help="the gemini executable (default: the cached npm install, then PATH)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="the models' context window")
    parser.add_argument("--turns", type=int, help=f"turns ({DEFAULT_TURNS}; {MARATHON_TURNS} with --marathon)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
    add_marathon_options(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.turns is None:
        args.turns = MARATHON_TURNS if args.marathon else DEFAULT_TURNS
    gemini = find_cli(args.gemini, DEFAULT_GEMINI_PATHS, "gemini", INSTALL)
    result = Report.start("gemini_cli", args)
    result.parameters["cli"] = " ".join(gemini)
    run_marathon(args, result, marathon_agent(gemini))
    result.publish(args.json)


if __name__ == "__main__":
    main()
