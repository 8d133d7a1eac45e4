"""The real Codex CLI through the Responses door: a scripted multi-turn task on a small fake model.

`codex exec` (0.169.0, see docs/research/responses.md section 3) talks to the proxy served in-process, which
forwards to the fake chat-completions upstream (tests/support/fake_upstream.py) whose responder plays the model: on a
user prompt it calls `exec_command` (`ls -la`), on that result it calls the custom tool `apply_patch` to add the
file the prompt names, on that result it answers "Done: created <file>." Turn 1 is a new thread; the next turns
resume it (`codex exec resume <thread id>`), so the whole task is one Codex thread and, for the proxy, one
session. The window is small (16k by default) so that Codex's system prompt and tools (~7.6k tokens) plus a few
turns make the proxy compact; the proxy's summarizer requests go to the same fake and get a fact-keeping summary.

Reported (printed, and with `--json PATH` written in bench/harness/report.py's format): every HTTP request Codex
made to the proxy (from the harness's recorder around the app, with the body of any 4xx/5xx), every request the
fake upstream received (messages, roles, tools, whether tool calls and results pair up, what the scripted model
answered), every Codex turn (exit code, items, outcome, whether the file exists, error lines from Codex's
stderr), then the proxy's `GET /sessions` and `GET /journal`.

With `--marathon` it runs issue 27's long agent session instead (bench/harness/marathon.py, as
bench/claude_code.py does): one `exec_command` of ~`--tool-output-tokens` per turn, with `--model-latency` and
`--summarizer-latency`, the proxy in its own process, measured turn by turn.

Run by hand: `python bench/codex.py [--codex PATH] [--window N] [--turns N] [--keep] [--dump FILE] [--json PATH]
[--marathon [--model-latency S] [--summarizer-latency S] [--tool-output-tokens N]]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.agents import (
    AgentTurn,
    HttpExchange,
    LogTap,
    Recorder,
    ScriptedModel,
    called_name,
    find_cli,
    log_notes,
    prompts,
    proxy_tables,
    requested_file,
    run_cli,
    short,
    upstream_table,
)
from bench.harness.marathon import MARATHON_TIMEOUT_S, Agent, TurnRunner, add_marathon_options, run_marathon
from bench.harness.report import Report, add_json_option, columns
from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.proxy_server import ProxyServer, make_config

MODEL = "gpt-5.5"
DEFAULT_WINDOW = 16_000
MAX_OUTPUT = 1024
DEFAULT_TURNS = 4
CODEX_TIMEOUT_S = 180.0
DEFAULT_CODEX_PATHS = (
    Path("/tmp/codexinst/node_modules/.bin/codex"),
    Path("/tmp/codexinst/node_modules/@openai/codex/bin/codex.js"),
)
INSTALL = "npm install --prefix /tmp/codexinst @openai/codex"
CODEX_COMPACTION_MARK = "CONTEXT CHECKPOINT COMPACTION"
DOOR = "/v1/responses"
NOISE = ("could not create PATH aliases",)
"""Codex stderr lines that are not about the proxy."""


# --- the scripted model ------------------------------------------------------------------------------------------


class Script(ScriptedModel):
    """On a user prompt: `exec_command ls -la`; on its result: `apply_patch` adding the file the prompt names; on
    that result: "Done: created <file>."; on Codex's own compaction prompt: a short summary."""

    def __init__(self) -> None:
        super().__init__(call_prefix="call_bench")
        self.command_arguments: Callable[[str], dict[str, Any]] = lambda cmd: {"cmd": cmd}
        self.command = "ls -la"
        """What each turn runs: `--output-lines` makes its output long (a real agent's tool outputs are)."""

    def reply(self, body: dict[str, Any]) -> tuple[Reply, str]:
        messages: list[dict[str, Any]] = body.get("messages") or []
        last = messages[-1] if messages else {}
        named = requested_file(messages)
        target = named or "hello.txt"
        lost = "" if named else "; NO prompt naming a file in context"
        if last.get("role") == "user":
            if CODEX_COMPACTION_MARK in content_text(last.get("content")):
                summary = Reply(content=f"Summary: the user asked for {target}; work in progress.")
                return summary, "text (Codex compaction)"
            return self.call("exec_command", self.command_arguments(self.command)), "call exec_command"
        if last.get("role") == "tool":
            name = called_name(messages, last.get("tool_call_id"))
            if name == "exec_command":
                patch = f"*** Begin Patch\n*** Add File: {target}\n+hello from the proxy\n*** End Patch\n"
                return self.call("apply_patch", {"input": patch}), f"call apply_patch{lost}"
            return Reply(content=f"Done: created {target}."), f"text (after {name}{lost})"
        return Reply(content="OK."), f"text (last role {last.get('role')})"


def command_arguments_for(tools: list[dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    """exec_command's arguments as the schema Codex sent asks for them (`cmd` string, or a `command` list)."""
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == "exec_command":
            properties = (function.get("parameters") or {}).get("properties") or {}
            if "cmd" in properties:
                return lambda cmd: {"cmd": cmd}
            if "command" in properties:
                if (properties["command"] or {}).get("type") == "array":
                    return lambda cmd: {"command": ["bash", "-lc", cmd]}
                return lambda cmd: {"command": cmd}
    return lambda cmd: {"cmd": cmd}


# --- Codex -------------------------------------------------------------------------------------------------------


def write_codex_home(home: Path, proxy_url: str, provider: str, auto_compact: int | None = None) -> None:
    """`provider`: `custom` (a provider of its own, HTTP only) or `builtin` (Codex's OpenAI provider pointed at the
    proxy with `openai_base_url`, the one-line setup: WebSocket mode first)."""
    home.mkdir(parents=True, exist_ok=True)
    common = f'model = "{MODEL}"\napproval_policy = "never"\nsandbox_mode = "danger-full-access"\n'
    if auto_compact is not None:
        common += f"model_auto_compact_token_limit = {auto_compact}\n"
    if provider == "builtin":
        (home / "config.toml").write_text(common + f'openai_base_url = "{proxy_url}/v1"\n')
        return
    (home / "config.toml").write_text(
        common + 'model_provider = "ctx"\n'
        "[model_providers.ctx]\n"
        'name = "Context Infinity"\n'
        f'base_url = "{proxy_url}/v1"\n'
        'env_key = "CTX_KEY"\n'
        'wire_api = "responses"\n'
        "stream_max_retries = 0\n"
        "request_max_retries = 0\n"
    )


def codex_argv(codex: list[str], prompt: str, thread_id: str | None) -> list[str]:
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json", "-m", MODEL]
    return [*codex, "exec", "resume", *flags, thread_id, prompt] if thread_id else [*codex, "exec", *flags, prompt]


class CodexTurn(AgentTurn):
    @property
    def thread_id(self) -> str | None:
        for event in self.run.events:
            if event.get("type") == "thread.started":
                return str(event.get("thread_id"))
        return None

    def outcome(self) -> str:
        for event in reversed(self.run.events):
            if event.get("type") == "turn.completed":
                usage = event.get("usage") or {}
                return f"completed (in {usage.get('input_tokens', '?')} / out {usage.get('output_tokens', '?')})"
            if event.get("type") == "turn.failed":
                return f"FAILED: {(event.get('error') or {}).get('message', event)}"
            if event.get("type") == "error":
                return f"ERROR: {event.get('message', event)}"
        return "no turn event"

    def items(self) -> str:
        kinds = Counter(
            str((event.get("item") or {}).get("type"))
            for event in self.run.events
            if event.get("type") == "item.completed"
        )
        return ", ".join(f"{kind}×{count}" for kind, count in kinds.items()) or "-"

    def last_message(self) -> str:
        for event in reversed(self.run.events):
            item = event.get("item") or {}
            if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                return str(item.get("text", ""))
        return ""


# --- the report --------------------------------------------------------------------------------------------------


def codex_kind(exchange: HttpExchange) -> str:
    try:
        metadata = json.loads(exchange.headers.get("x-codex-turn-metadata", "{}"))
    except ValueError:
        metadata = {}
    return str(metadata.get("request_kind", "-")) if isinstance(metadata, dict) else "-"


def http_table(report: Report, exchanges: list[HttpExchange]) -> None:
    table = report.table(
        "http",
        "HTTP requests Codex made to the proxy",
        columns(
            ("index", "#"), ("request",), ("status",), ("kind",), ("window",), ("input_items", "input items"),
            ("body_kb", "body KB"),
        ),
    )  # fmt: skip
    for index, exchange in enumerate(exchanges, 1):
        table.add(
            index=index,
            request=f"{exchange.method} {exchange.target}",
            status=exchange.status,
            kind=codex_kind(exchange),
            window=exchange.headers.get("x-codex-window-id", "-").rsplit(":", 1)[-1],
            input_items=len(exchange.json().get("input") or []),
            body_kb=len(exchange.request_body) // 1024,
        )
    others = Counter(f"{e.method} {e.path}" for e in exchanges if (e.method, e.path) != ("POST", DOOR))
    table.notes.append(f"other than POST {DOOR}: {dict(others) or 'none'}")
    for index, exchange in enumerate(exchanges, 1):
        if exchange.status >= 400:
            answer = short(exchange.response_body.decode("utf-8", "replace"), 600)
            table.notes.append(f"  #{index} {exchange.status} body: {answer}")


def turns_table(report: Report, turns: list[CodexTurn], workdir: Path) -> None:
    table = report.table(
        "turns",
        "Codex turns",
        columns(
            ("turn",), ("thread",), ("exit",), ("seconds", "time s", ".1f"), ("http",), ("upstream",), ("items",),
            ("file",), ("outcome",),
        ),
    )  # fmt: skip
    for turn in turns:
        table.add(
            turn=turn.number,
            thread="new" if turn.number == 1 else "resume",
            exit=turn.run.exit_code,
            seconds=turn.run.seconds,
            http=turn.http_requests,
            upstream=turn.upstream_requests,
            items=turn.items(),
            file=turn.created(workdir),
            outcome=turn.outcome(),
        )
    for turn in turns:
        table.notes.append(f"turn {turn.number} last agent message: {short(turn.last_message(), 120)!r}")
        noisy = turn.error_lines(NOISE)
        if noisy:
            lines = len(turn.run.stderr.splitlines())
            table.notes.append(f"turn {turn.number} stderr ({len(noisy)} error-like lines of {lines}):")
            table.notes.extend(f"    {short(line, 300)}" for line in noisy[:8])
    hello = workdir / "hello.txt"
    if hello.exists():
        table.notes.append(f"hello.txt contents: {hello.read_text()!r}")


def codex_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CODEX_HOME": str(home),
        "CTX_KEY": "dummy",
        "OPENAI_API_KEY": "dummy",
        "CODEX_API_KEY": "dummy",
        "NO_COLOR": "1",
    }


def marathon_agent(args: argparse.Namespace, codex: list[str]) -> Agent:
    """Codex for the marathon (bench/harness/marathon.py): `codex exec`, then `codex exec resume` per turn."""

    def start(proxy_url: str, tmp: Path) -> TurnRunner:
        workdir, home = tmp / "work", tmp / "codex-home"
        workdir.mkdir()
        write_codex_home(home, proxy_url, args.provider, args.auto_compact)
        thread: list[str] = []

        def run_turn(number: int, prompt: str) -> tuple[int, bool, str]:
            argv = codex_argv(codex, prompt, thread[0] if thread else None)
            run = run_cli(argv, workdir, codex_env(home), MARATHON_TIMEOUT_S)
            turn = CodexTurn(number, prompt, run, 0, 0)
            if not thread and turn.thread_id:
                thread.append(turn.thread_id)
            return run.exit_code, run.exit_code != 0, turn.last_message() or f"(no answer; exit {run.exit_code})"

        return run_turn

    def arguments(command: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
        return command_arguments_for(tools)(command)

    return Agent("codex", [MODEL], "exec_command", arguments, start, max_output=MAX_OUTPUT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--codex", help="the codex executable (default: /tmp/codexinst, then PATH)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="the model's context window")
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS, help="Codex turns in the thread")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
    parser.add_argument("--dump", type=Path, help="write the upstream's request bodies here as JSON lines")
    parser.add_argument("--output-lines", type=int, help="each turn's command also prints this many numbered lines")
    parser.add_argument(
        "--auto-compact", type=int, help="Codex's model_auto_compact_token_limit (its own compaction past it)"
    )
    parser.add_argument(
        "--provider",
        choices=("custom", "builtin"),
        default="custom",
        help="Codex's provider: one of its own (HTTP), or its OpenAI provider with openai_base_url (WebSocket first)",
    )
    add_marathon_options(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    codex = find_cli(args.codex, DEFAULT_CODEX_PATHS, "codex", INSTALL)
    result = Report.start("codex", args)
    result.parameters["cli"] = " ".join(codex)
    if args.marathon:
        run_marathon(args, result, marathon_agent(args, codex))
        result.publish(args.json)
        return

    tap = LogTap()
    logging.getLogger().addHandler(tap)
    tmp = Path(tempfile.mkdtemp(prefix="bench-codex-"))
    workdir, home = tmp / "work", tmp / "codex-home"
    workdir.mkdir()
    script = Script()
    if args.output_lines:
        script.command = f"ls -la && seq -f 'line %g of the build log, nothing to see here' 1 {args.output_lines}"
    recorder = Recorder()
    try:
        with FakeUpstream(context_window=args.window) as fake:
            fake.responder = script
            model = {
                "name": MODEL,
                "model": "openai/fake-model",
                "api_base": fake.url,
                "api_key": "k",
                "context_window": args.window,
                "max_output": MAX_OUTPUT,
            }
            raw = make_config(tmp, fake.url, models=[model], upstream={"timeout_s": 30})
            with ProxyServer(raw, tmp, middleware=recorder.around) as proxy:
                write_codex_home(home, proxy.url, args.provider, args.auto_compact)
                print(f"codex: {' '.join(codex)}; window {args.window}; workdir {workdir}", file=sys.stderr)
                env = codex_env(home)
                turns: list[CodexTurn] = []
                thread_id: str | None = None
                for number, prompt in enumerate(prompts(args.turns), 1):
                    before, http_before = len(fake.requests), len(recorder.exchanges)
                    run = run_cli(codex_argv(codex, prompt, thread_id), workdir, env, CODEX_TIMEOUT_S)
                    if number == 1 and fake.requests:
                        script.command_arguments = command_arguments_for(fake.requests[0].body.get("tools") or [])
                    http = len(recorder.exchanges) - http_before
                    turn = CodexTurn(number, prompt, run, http, len(fake.requests) - before)
                    turns.append(turn)
                    thread_id = thread_id or turn.thread_id
                    if thread_id is None:
                        result.notes.append(
                            f"turn {number}: no thread id; stopped. stderr tail: {short(run.stderr[-800:], 800)}"
                        )
                        break
                first_tools = fake.requests[0].body.get("tools") or [] if fake.requests else []
                exec_tool = next(
                    (tool for tool in first_tools if (tool.get("function") or {}).get("name") == "exec_command"),
                    None,
                )
                if exec_tool is not None:
                    required = exec_tool["function"].get("parameters", {}).get("required")
                    result.notes.append(f"exec_command schema: required={required}; thread {thread_id}")
                if args.dump is not None:
                    args.dump.write_text("".join(json.dumps(r.body) + "\n" for r in fake.requests))
                http_table(result, recorder.exchanges)
                upstream_table(result, fake, script.answers)
                turns_table(result, turns, workdir)
                posts = sum(1 for e in recorder.exchanges if (e.method, e.path) == ("POST", DOOR))
                proxy_tables(result, proxy.url, posts, DOOR)
        log_notes(result, tap)
    finally:
        if args.keep:
            result.notes.append(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result.publish(args.json)


if __name__ == "__main__":
    main()
