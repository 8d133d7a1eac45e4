"""The real Claude Code through the Messages door: a scripted multi-turn task on a small fake model.

`claude -p` (npm `@anthropic-ai/claude-code`) talks to the proxy served in-process (`ANTHROPIC_BASE_URL`), which
forwards to the fake chat-completions upstream (tests/support/fake_upstream.py) whose responder plays the model: on a
user prompt it calls `Bash` (`ls -la`), on that result it calls `Write` to create the file the prompt names (in
the bench's working directory), on that result it answers "Done: created <file>.". Requests that offer no tools
(Claude Code's side requests: titles, topic checks, quota probes) get a short text answer; the proxy's
summarizer requests get a fact-keeping summary. Turn 1 is a new conversation; the next turns `--continue` it,
so the whole task is one Claude Code session and, for the proxy, one session (`X-Claude-Code-Session-Id`).
The main model is `fake-sonnet`, the small fast one `fake-haiku` (with `--plain`: `claude-sonnet-4-5` and
`claude-haiku-4-5`, for which Claude Code sends no `system` messages among the messages, and no experimental
betas); both are configured on the one fake.

Reported (printed, and with `--json PATH` written in bench/harness/report.py's format): every HTTP request Claude
Code made to the proxy (path with its query, status, model, headers such as
`anthropic-beta` and `X-Claude-Code-Session-Id`, the body of any 4xx/5xx and of every `count_tokens` answer),
every request the fake upstream received (messages, roles, tools, whether tool calls and results pair up, what
the scripted model answered), every Claude Code turn (exit code, tool uses, result, whether the file exists,
error-like stderr lines), then the proxy's `GET /sessions` and `GET /journal`.

With `--marathon` it runs issue 27's long agent session instead (bench/harness/marathon.py): `--turns` turns of
one Bash command each (~`--tool-output-tokens` of output), the main model answering after `--model-latency`
seconds and the proxy's summarizer (a separate model) after `--summarizer-latency`, the proxy in its own process;
it prints per-turn latency, summarizer calls, rejections, tokens sent and cached, the proxy's CPU time and RSS,
and whether the first turn's fact is still answered at the end. Issue 27's setting was
`python bench/claude_code.py --marathon --window 32768 --turns 200`. Claude Code 2.1.197 sends a preamble of
~25.6k tokens by the proxy's count (a ~7k system prompt, 24 tools worth ~18.6k) and asks max_tokens=32000; the
proxy gives the answer a quarter of what that preamble leaves of a 32k window (~1.4k, not below 1,024:
`Budgets.fitted_output`), so a turn's ~2.4k-token tool output fits beside the recent messages. With the
`fake-*` names Claude Code also puts a `system` reminder among the messages every few turns; each is kept
verbatim and splits the summarizable past into pieces summarized apart, so at 32k the older turns stop fitting
after ~60 turns (`--plain` sends none, and lasts). At 32k every turn is a crossing (the recent block alone is
past `compact_to`), so the summarizer is called about once a turn; `--window 65536` has room for hundreds.

Run by hand: `python bench/claude_code.py [--claude PATH] [--window N] [--turns N] [--plain]
[--max-output-tokens N] [--keep] [--dump FILE] [--json PATH] [--marathon [--model-latency S]
[--summarizer-latency S] [--tool-output-tokens N]]`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter
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

MODELS = ("fake-sonnet", "fake-haiku")
"""The main and the small fast model Claude Code asks for; configured on the proxy, both on the one fake."""
PLAIN_MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5")
"""With --plain: names Claude Code 2.1.x sends no system messages among the messages for."""
DEFAULT_WINDOW = 32_000
DEFAULT_TURNS = 3
CLAUDE_TIMEOUT_S = 240.0
DEFAULT_CLAUDE_PATHS = (
    Path("/tmp/claudeinst/node_modules/.bin/claude"),
    Path("/tmp/claudeinst/node_modules/@anthropic-ai/claude-code/cli.js"),
)
INSTALL = (
    "npm install --prefix /tmp/claudeinst @anthropic-ai/claude-code"
    " (then `node install.cjs` in its package if npm skipped the postinstall)"
)
DOOR = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
MESSAGES_PATHS = (DOOR, COUNT_TOKENS)
NOTABLE_HEADERS = ("anthropic-beta", "anthropic-version", "x-app", "user-agent", "x-stainless-retry-count")
FILE_CONTENT = "hello from the proxy\n"


# --- what Claude Code asked of the proxy -------------------------------------------------------------------------


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    if isinstance(system, list):
        return " ".join(str(block.get("text", "")) for block in system if isinstance(block, dict))
    return str(system or "")


def request_kind(body: dict[str, Any]) -> str:
    """What a Messages request is for, from its body: the agent's main loop, or a side request."""
    if not body:
        return "-"
    if body.get("tools"):
        return "main" if any(tool.get("name") == "Bash" for tool in body["tools"]) else "tools"
    if body.get("max_tokens") == 1:
        return "probe(max_tokens=1)"
    text = system_text(body)
    for mark, kind in (("title", "title"), ("topic", "topic"), ("summar", "summary"), ("prefix", "prefix")):
        if mark in text.lower():
            return f"side:{kind}"
    return "side"


def http_table(report: Report, exchanges: list[HttpExchange]) -> None:
    table = report.table(
        "http",
        "HTTP requests Claude Code made to the proxy",
        columns(
            ("index", "#"), ("request",), ("status",), ("model",), ("kind",), ("mode",), ("max_tokens", "max_tok"),
            ("messages", "msgs"), ("tools",), ("session",), ("retry",), ("body_kb", "body KB"),
        ),
    )  # fmt: skip
    for index, exchange in enumerate(exchanges, 1):
        body = exchange.json()
        table.add(
            index=index,
            request=f"{exchange.method} {exchange.target}",
            status=exchange.status,
            model=body.get("model"),
            kind="count" if exchange.path == COUNT_TOKENS else request_kind(body),
            mode="stream" if body.get("stream") else "json",
            max_tokens=body.get("max_tokens"),
            messages=len(body.get("messages") or []),
            tools=len(body.get("tools") or []),
            session=exchange.headers.get("x-claude-code-session-id", "-")[:8],
            retry=exchange.headers.get("x-stainless-retry-count"),
            body_kb=len(exchange.request_body) // 1024,
        )
    notes = table.notes
    others = Counter(f"{e.method} {e.path}" for e in exchanges if e.path not in MESSAGES_PATHS)
    notes.append(f"other than the Messages door: {dict(others) or 'none'}")
    sessions = Counter(e.headers.get("x-claude-code-session-id", "-") for e in exchanges)
    notes.append(f"session ids (X-Claude-Code-Session-Id): {dict(sessions)}")
    for name in NOTABLE_HEADERS:
        notes.append(f"{name}: {dict(Counter(e.headers.get(name, '-') for e in exchanges))}")
    extra = sorted(
        {
            k
            for e in exchanges
            for k in e.headers
            if k.startswith(("x-", "anthropic")) and not k.startswith("x-stainless")
        }
    )
    notes.append(f"x-/anthropic headers seen: {', '.join(extra) or 'none'}")
    odd_roles = Counter(
        f"{message.get('role')} at messages[{position}]"
        for e in exchanges
        for position, message in enumerate(e.json().get("messages") or [])
        if message.get("role") not in ("user", "assistant")
    )
    notes.append(f"messages with a role other than user/assistant: {dict(odd_roles) or 'none'}")
    notes.append(f"body fields: {dict(Counter(k for e in exchanges for k in e.json()))}")
    for index, exchange in enumerate(exchanges, 1):
        if exchange.status >= 400:
            notes.append(
                f"  #{index} {exchange.status} body: {short(exchange.response_body.decode('utf-8', 'replace'), 600)}"
            )
    counts = [(index, e) for index, e in enumerate(exchanges, 1) if e.path == COUNT_TOKENS]
    notes.append(f"count_tokens calls: {len(counts)}")
    for index, exchange in counts:
        asked = exchange.json()
        sizes = f"msgs={len(asked.get('messages') or [])} tools={len(asked.get('tools') or [])}"
        answer = short(exchange.response_body.decode("utf-8", "replace"), 300)
        notes.append(f"  #{index} {exchange.status} model={asked.get('model')} {sizes} -> {answer}")


# --- the scripted model ------------------------------------------------------------------------------------------


class Script(ScriptedModel):
    """On a user prompt: `Bash ls -la`; on its result: `Write` the file the prompt names (in `workdir`); on that
    result: "Done: created <file>."; requests that offer no `Bash` (side requests): "OK."."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(call_prefix="toolu_bench")
        self.workdir = workdir

    def reply(self, body: dict[str, Any]) -> tuple[Reply, str]:
        messages: list[dict[str, Any]] = body.get("messages") or []
        tools = {str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or []}
        if "Bash" not in tools:
            return Reply(content="OK."), f"text (side request, {len(tools)} tools)"
        named = requested_file(messages)
        target = named or "hello.txt"
        lost = "" if named else "; NO prompt naming a file in context"
        # A tool_result comes as tool messages, possibly followed by a user message with the same Anthropic
        # message's other blocks (system reminders): what decides is whether a tool message follows the last
        # assistant message.
        last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        results = [m for m in messages[last_assistant + 1 :] if m.get("role") == "tool"]
        if not results:
            return self.call("Bash", {"command": "ls -la", "description": "List files"}), "call Bash"
        name = called_name(messages, results[-1].get("tool_call_id"))
        if name == "Bash":
            arguments = {"file_path": str(self.workdir / target), "content": FILE_CONTENT}
            return self.call("Write", arguments), f"call Write {target}{lost}"
        return Reply(content=f"Done: created {target}."), f"text (after {name}{lost})"


# --- Claude Code -------------------------------------------------------------------------------------------------


def claude_env(
    home: Path, proxy_url: str, models: tuple[str, str], plain: bool, max_output: int | None
) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TERM")
    extra = {"CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1"} if plain else {}
    if max_output is not None:
        extra["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output)
    return {
        **extra,
        **{name: os.environ[name] for name in keep if name in os.environ},
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": proxy_url,
        "ANTHROPIC_API_KEY": "sk-ant-bench-dummy",
        "ANTHROPIC_MODEL": models[0],
        "ANTHROPIC_SMALL_FAST_MODEL": models[1],
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": models[1],
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "IS_SANDBOX": "1",
        "NO_COLOR": "1",
    }


def claude_argv(claude: list[str], model: str, prompt: str, resume: bool) -> list[str]:
    flags = ["--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", model]
    return [*claude, "-p", prompt, *flags, *(["--continue"] if resume else [])]


class ClaudeTurn(AgentTurn):
    def result(self) -> dict[str, Any]:
        for event in reversed(self.run.events):
            if event.get("type") == "result":
                return dict(event)
        return {}

    @property
    def session_id(self) -> str | None:
        for event in self.run.events:
            if event.get("session_id"):
                return str(event["session_id"])
        return None

    def outcome(self) -> str:
        result = self.result()
        if not result:
            return "no result event"
        usage = result.get("usage") or {}
        tokens = f"in {usage.get('input_tokens', '?')} / out {usage.get('output_tokens', '?')}"
        state = "ERROR " if result.get("is_error") else ""
        return f"{state}{result.get('subtype')} ({result.get('num_turns')} model turns, {tokens})"

    def tool_uses(self) -> str:
        uses: Counter[str] = Counter()
        for event in self.run.events:
            content = (
                (event.get("message") or {}).get("content") if event.get("type") in ("assistant", "user") else None
            )
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_use":
                    uses[str(block.get("name"))] += 1
                elif block.get("type") == "tool_result" and block.get("is_error"):
                    uses["error-result"] += 1
        return ", ".join(f"{name}×{count}" for name, count in uses.items()) or "-"

    def tool_errors(self) -> list[str]:
        errors = []
        for event in self.run.events:
            content = (event.get("message") or {}).get("content") if event.get("type") == "user" else None
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result" and block.get("is_error"):
                    errors.append(content_text(block.get("content")))
        return errors


# --- the report --------------------------------------------------------------------------------------------------


def schema_notes(report: Report, fake: FakeUpstream) -> None:
    """The Bash and Write tools' schemas as Claude Code offered them (first request with tools)."""
    for request in fake.requests:
        for tool in request.body.get("tools") or []:
            function = tool.get("function") or {}
            if function.get("name") in ("Bash", "Write"):
                parameters = function.get("parameters") or {}
                properties = ", ".join((parameters.get("properties") or {}).keys())
                report.notes.append(
                    f"{function['name']} schema: properties [{properties}], required {parameters.get('required')}"
                )
        if request.body.get("tools"):
            break


def turns_table(report: Report, turns: list[ClaudeTurn], workdir: Path) -> None:
    table = report.table(
        "turns",
        "Claude Code turns",
        columns(
            ("turn",), ("how",), ("exit",), ("seconds", "time s", ".1f"), ("http",), ("upstream",), ("session",),
            ("tool_uses", "tool uses"), ("file",), ("outcome",),
        ),
    )  # fmt: skip
    for turn in turns:
        table.add(
            turn=turn.number,
            how="new" if turn.number == 1 else ("/compact" if turn.prompt == "/compact" else "--continue"),
            exit=turn.run.exit_code,
            seconds=turn.run.seconds,
            http=turn.http_requests,
            upstream=turn.upstream_requests,
            session=(turn.session_id or "-")[:8],
            tool_uses=turn.tool_uses(),
            file=turn.created(workdir),
            outcome=turn.outcome(),
        )
    notes = table.notes
    for turn in turns:
        notes.append(f"turn {turn.number} result: {short(str(turn.result().get('result', '')), 160)!r}")
        notes.extend(f"    tool error: {short(error, 300)}" for error in turn.tool_errors()[:4])
        lines = turn.run.stderr.splitlines()
        noisy = turn.error_lines()
        if noisy or (lines and turn.run.exit_code != 0):
            notes.append(f"turn {turn.number} stderr ({len(noisy)} error-like lines of {len(lines)}):")
            notes.extend(f"    {short(line, 300)}" for line in (noisy or lines[-8:])[:8])
        others = [e for e in turn.run.events if e.get("type") == "non-json"]
        if others:
            first = short(others[0]["text"], 200)
            notes.append(f"turn {turn.number} non-JSON stdout lines: {len(others)}, first {first!r}")
    for name in ["hello.txt", *(f"turn{n}.txt" for n in range(2, len(turns) + 1))]:
        path = workdir / name
        notes.append(f"{name}: {repr(path.read_text()) if path.exists() else 'missing'}")


def marathon_agent(args: argparse.Namespace, claude: list[str]) -> Agent:
    """Claude Code for the marathon (bench/harness/marathon.py): one `claude -p --continue` per turn."""
    models = PLAIN_MODELS if args.plain else MODELS

    def start(proxy_url: str, tmp: Path) -> TurnRunner:
        workdir, home = tmp / "work", tmp / "home"
        workdir.mkdir()
        home.mkdir()
        env = claude_env(home, proxy_url, models, args.plain, args.max_output_tokens)

        def run_turn(number: int, prompt: str) -> tuple[int, bool, str]:
            run = run_cli(claude_argv(claude, models[0], prompt, resume=number > 1), workdir, env, MARATHON_TIMEOUT_S)
            outcome = ClaudeTurn(number, prompt, run, 0, 0).result()
            answer = str(outcome.get("result") or f"(no result; exit {run.exit_code})")
            return run.exit_code, bool(outcome.get("is_error")), answer

        return run_turn

    def arguments(command: str, _tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {"command": command, "description": "Run the command"}

    return Agent("claude", models, "Bash", arguments, start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--claude", help="the claude executable (default: /tmp/claudeinst, then PATH)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="the models' context window")
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS, help="Claude Code turns in the conversation")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
    parser.add_argument(
        "--plain",
        action="store_true",
        help=f"use the models {', '.join(PLAIN_MODELS)} and no experimental betas (no system messages in messages)",
    )
    parser.add_argument(
        "--max-output-tokens",
        type=int,
        help="set CLAUDE_CODE_MAX_OUTPUT_TOKENS (Claude Code asks max_tokens=32000 by default)",
    )
    parser.add_argument(
        "--compact-every", type=int, help="run `/compact` (Claude Code's own compaction) after every N turns"
    )
    parser.add_argument("--dump", type=Path, help="write the Messages request bodies here as JSON lines")
    add_marathon_options(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    claude = find_cli(args.claude, DEFAULT_CLAUDE_PATHS, "claude", INSTALL)
    result = Report.start("claude_code", args)
    result.parameters["cli"] = " ".join(claude)
    if args.marathon:
        run_marathon(args, result, marathon_agent(args, claude))
        result.publish(args.json)
        return

    tap = LogTap()
    logging.getLogger().addHandler(tap)
    tmp = Path(tempfile.mkdtemp(prefix="bench-claude-"))
    workdir, home = tmp / "work", tmp / "home"
    workdir.mkdir()
    home.mkdir()
    script = Script(workdir)
    recorder = Recorder(keep_answers=(COUNT_TOKENS,))
    models = PLAIN_MODELS if args.plain else MODELS
    try:
        with FakeUpstream(context_window=args.window) as fake:
            fake.responder = script
            entries = [
                {
                    "name": name,
                    "model": "openai/fake-model",
                    "api_base": fake.url,
                    "api_key": "k",
                    "context_window": args.window,
                }
                for name in models
            ]
            raw = make_config(tmp, fake.url, models=entries, upstream={"timeout_s": 30})
            with ProxyServer(raw, tmp, middleware=recorder.around) as proxy:
                env = claude_env(home, proxy.url, models, args.plain, args.max_output_tokens)
                betas = "plain (experimental betas off)" if args.plain else "default betas"
                limit = f"max output {args.max_output_tokens or 'default'}"
                print(
                    f"claude: {' '.join(claude)}; window {args.window}; {betas}; {limit}; workdir {workdir}",
                    file=sys.stderr,
                )
                turns: list[ClaudeTurn] = []
                asks = list(prompts(args.turns))
                if args.compact_every:
                    every = args.compact_every
                    compacts = ["/compact"]
                    asks = [a for n, ask in enumerate(asks, 1) for a in (ask, *(compacts if n % every == 0 else []))]
                for number, prompt in enumerate(asks, 1):
                    before, http_before = len(fake.requests), len(recorder.exchanges)
                    command = claude_argv(claude, models[0], prompt, resume=number > 1)
                    run = run_cli(command, workdir, env, CLAUDE_TIMEOUT_S)
                    http = len(recorder.exchanges) - http_before
                    turn = ClaudeTurn(number, prompt, run, http, len(fake.requests) - before)
                    turns.append(turn)
                    if run.exit_code != 0 and number == 1 and not turn.result():
                        tail = short(run.stderr[-800:], 800)
                        result.notes.append(f"turn 1 failed (exit {run.exit_code}); stopped. stderr tail: {tail}")
                        break
                if args.dump is not None:
                    bodies = (e.request_body.decode("utf-8", "replace") for e in recorder.exchanges)
                    args.dump.write_text("".join(body + "\n" for body in bodies if body))
                http_table(result, recorder.exchanges)
                upstream_table(result, fake, script.answers)
                schema_notes(result, fake)
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
