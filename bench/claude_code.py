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

Printed: every HTTP request Claude Code made to the proxy (path with its query, status, model, headers such as
`anthropic-beta` and `X-Claude-Code-Session-Id`, the body of any 4xx/5xx and of every `count_tokens` answer),
every request the fake upstream received (messages, roles, tools, whether tool calls and results pair up, what
the scripted model answered), every Claude Code turn (exit code, tool uses, result, whether the file exists,
error-like stderr lines), then the proxy's `GET /sessions` and `GET /journal`.

Run by hand: `python bench/claude_code.py [--claude PATH] [--window N] [--turns N] [--plain]
[--max-output-tokens N] [--keep] [--dump FILE]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.codex import (
    ERROR_LINE,
    ASGIApp,
    HttpExchange,
    LogTap,
    Message,
    Proxy,
    Receive,
    Recorder,
    Scope,
    Send,
    called_name,
    pairing_problem,
    requested_file,
    roles_run,
    short,
    table,
)
from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.proxy_server import make_config
from tests.support.scripted_session import fact_keeping_summary, is_summarizer_request

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
MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
NOTABLE_HEADERS = ("anthropic-beta", "anthropic-version", "x-app", "user-agent", "x-stainless-retry-count")
FILE_CONTENT = "hello from the proxy\n"


def prompts(turns: int) -> list[str]:
    first = "List the files here, then create hello.txt containing a greeting."
    rest = [f"Now list the files again and create turn{n}.txt as well." for n in range(2, turns + 1)]
    return [first, *rest]


# --- what Claude Code asked of the proxy -------------------------------------------------------------------------


@dataclass
class QueryTap:
    """Sits inside bench.codex's Recorder: adds the query string to the exchange it just opened, and keeps the
    answer of every `count_tokens` request (the recorder keeps error bodies only)."""

    app: ASGIApp
    recorder: Recorder
    count_answers: dict[int, bytes] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The recorder appends the exchange and calls its app with no await in between: the last one is ours.
        index = len(self.recorder.exchanges) - 1
        exchange = self.recorder.exchanges[index]
        if query := scope.get("query_string", b"").decode("latin-1"):
            exchange.path = f"{scope['path']}?{query}"
        if scope["path"] != "/v1/messages/count_tokens":
            await self.app(scope, receive, send)
            return
        answer = bytearray()

        async def keeping_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                answer.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, keeping_send)
        finally:
            self.count_answers[index] = bytes(answer)


def request_json(exchange: HttpExchange) -> dict[str, Any]:
    try:
        body = json.loads(exchange.request_body)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


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


def report_http(exchanges: list[HttpExchange], count_answers: dict[int, bytes]) -> None:
    print("\n== HTTP requests Claude Code made to the proxy")
    rows = []
    for index, exchange in enumerate(exchanges, 1):
        body = request_json(exchange)
        session = exchange.headers.get("x-claude-code-session-id", "-")
        rows.append(
            [
                str(index),
                f"{exchange.method} {exchange.path}",
                str(exchange.status),
                str(body.get("model", "-")),
                "count" if exchange.path.startswith("/v1/messages/count_tokens") else request_kind(body),
                "stream" if body.get("stream") else "json",
                str(body.get("max_tokens", "-")),
                str(len(body.get("messages") or [])),
                str(len(body.get("tools") or [])),
                session[:8],
                exchange.headers.get("x-stainless-retry-count", "-"),
                f"{len(exchange.request_body) // 1024} KB",
            ]
        )
    header = ["#", "request", "status", "model", "kind", "mode", "max_tok", "msgs", "tools", "session", "retry", "body"]
    print(table(rows, header))
    others = Counter(
        f"{e.method} {e.path.split('?')[0]}" for e in exchanges if e.path.split("?")[0] not in MESSAGES_PATHS
    )
    print(f"other than the Messages door: {dict(others) or 'none'}")
    sessions = Counter(e.headers.get("x-claude-code-session-id", "-") for e in exchanges)
    print(f"session ids (X-Claude-Code-Session-Id): {dict(sessions)}")
    for name in NOTABLE_HEADERS:
        values = Counter(e.headers.get(name, "-") for e in exchanges)
        print(f"{name}: {dict(values)}")
    extra = sorted(
        {
            k
            for e in exchanges
            for k in e.headers
            if k.startswith(("x-", "anthropic")) and not k.startswith("x-stainless")
        }
    )
    print(f"x-/anthropic headers seen: {', '.join(extra) or 'none'}")
    odd_roles = Counter(
        f"{message.get('role')} at messages[{position}]"
        for e in exchanges
        for position, message in enumerate(request_json(e).get("messages") or [])
        if message.get("role") not in ("user", "assistant")
    )
    print(f"messages with a role other than user/assistant: {dict(odd_roles) or 'none'}")
    fields = Counter(k for e in exchanges for k in request_json(e))
    print(f"body fields: {dict(fields)}")
    for index, exchange in enumerate(exchanges, 1):
        if exchange.status >= 400:
            print(f"  #{index} {exchange.status} body: {short(exchange.response_body.decode('utf-8', 'replace'), 600)}")
    counts = [(i, a) for i, a in sorted(count_answers.items())]
    print(f"count_tokens calls: {len(counts)}")
    for index, answer in counts:
        asked = request_json(exchanges[index])
        sizes = f"msgs={len(asked.get('messages') or [])} tools={len(asked.get('tools') or [])}"
        what = f"model={asked.get('model')} {sizes}"
        print(f"  #{index + 1} {exchanges[index].status} {what} -> {short(answer.decode('utf-8', 'replace'), 300)}")


# --- the scripted model ------------------------------------------------------------------------------------------


@dataclass
class Script:
    """The fake upstream's responder: the model's side of the task, and a note of what it answered."""

    workdir: Path
    answers: list[str] = field(default_factory=list)
    calls: int = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply, note = self._reply(body)
        self.answers.append(note)
        return reply

    def _call(self, name: str, arguments: dict[str, Any]) -> Reply:
        self.calls += 1
        function = {"name": name, "arguments": json.dumps(arguments)}
        call: dict[str, Any] = {"id": f"toolu_bench{self.calls}", "type": "function", "function": function}
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    def _reply(self, body: dict[str, Any]) -> tuple[Reply, str]:
        if is_summarizer_request(body):
            return fact_keeping_summary(body), "summary (proxy summarizer)"
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
            return self._call("Bash", {"command": "ls -la", "description": "List files"}), "call Bash"
        name = called_name(messages, results[-1].get("tool_call_id"))
        if name == "Bash":
            arguments = {"file_path": str(self.workdir / target), "content": FILE_CONTENT}
            return self._call("Write", arguments), f"call Write {target}{lost}"
        return Reply(content=f"Done: created {target}."), f"text (after {name}{lost})"


# --- Claude Code -------------------------------------------------------------------------------------------------


def find_claude(given: str | None) -> list[str]:
    candidates = [Path(given)] if given else [*DEFAULT_CLAUDE_PATHS]
    if not given and (on_path := shutil.which("claude")):
        candidates.append(Path(on_path))
    for path in candidates:
        if path.exists():
            resolved = path.resolve()
            return ["node", str(resolved)] if resolved.suffix in (".js", ".cjs") else [str(path)]
    where = given or ", ".join(str(p) for p in DEFAULT_CLAUDE_PATHS) + " or PATH"
    sys.exit(
        f"claude not found at {where}; install it: npm install --prefix /tmp/claudeinst @anthropic-ai/claude-code"
        " (then `node install.cjs` in its package if npm skipped the postinstall)"
    )


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


@dataclass
class ClaudeTurn:
    number: int
    prompt: str
    exit_code: int
    seconds: float
    events: list[dict[str, Any]]
    stderr: str
    http_requests: int
    """Requests Claude Code made to the proxy during the turn."""
    upstream_requests: int
    """Requests the fake upstream received during the turn (the proxy's summarizer calls included)."""

    def result(self) -> dict[str, Any]:
        for event in reversed(self.events):
            if event.get("type") == "result":
                return event
        return {}

    @property
    def session_id(self) -> str | None:
        for event in self.events:
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
        for event in self.events:
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
        for event in self.events:
            content = (event.get("message") or {}).get("content") if event.get("type") == "user" else None
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result" and block.get("is_error"):
                    errors.append(content_text(block.get("content")))
        return errors


def run_claude(
    claude: list[str], env: dict[str, str], workdir: Path, prompt: str, resume: bool
) -> tuple[int, float, list[dict[str, Any]], str]:
    flags = [
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
        "--model",
        env["ANTHROPIC_MODEL"],
    ]
    args = [*claude, "-p", prompt, *flags, *(["--continue"] if resume else [])]
    started = time.monotonic()
    try:
        done = subprocess.run(
            args,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLAUDE_TIMEOUT_S,
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = (exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or "") + "\n(timed out)"
    events = []
    for line in stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            events.append({"type": "non-json", "text": line})
    return code, time.monotonic() - started, events, stderr


# --- the report --------------------------------------------------------------------------------------------------


def report_upstream(fake: FakeUpstream, answers: list[str]) -> None:
    print("\n== Requests the fake upstream received (S system, U user, A assistant, T tool)")
    rows = []
    first_tools: list[str] | None = None
    for index, received in enumerate(fake.requests, 1):
        body = received.body
        messages: list[dict[str, Any]] = body.get("messages") or []
        tools = [str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or []]
        problem = pairing_problem(messages)
        if tools and first_tools is None:
            first_tools = tools
            print(f"tools offered (T1): {', '.join(tools)}")
        rows.append(
            [
                str(index),
                str(body.get("model", "-")),
                str(len(messages)),
                str(fake.prompt_tokens(messages)),
                str(body.get("max_tokens") or body.get("max_completion_tokens") or "-"),
                short(roles_run(messages), 40),
                "none" if not tools else f"{len(tools)} (T1)" if tools == first_tools else f"{len(tools)}: other",
                "ok" if problem is None else f"BROKEN: {problem}",
                answers[index - 1] if index <= len(answers) else "(refused)",
            ]
        )
    print(table(rows, ["#", "model", "msgs", "tokens", "max_tok", "roles", "tools", "pairing", "scripted answer"]))
    print(f"refused by the fake: {len(fake.rejected)}")
    for body in fake.rejected:
        print(f"  {short(json.dumps(body), 400)}")
    for request in fake.requests:
        for tool in request.body.get("tools") or []:
            function = tool.get("function") or {}
            if function.get("name") in ("Bash", "Write"):
                parameters = function.get("parameters") or {}
                properties = ", ".join((parameters.get("properties") or {}).keys())
                print(f"{function['name']} schema: properties [{properties}], required {parameters.get('required')}")
        if request.body.get("tools"):
            break


def report_turns(turns: list[ClaudeTurn], workdir: Path) -> None:
    print("\n== Claude Code turns")
    rows = []
    for turn in turns:
        target = requested_file([{"role": "user", "content": turn.prompt}]) or "hello.txt"
        created = workdir / target
        rows.append(
            [
                str(turn.number),
                "new" if turn.number == 1 else "--continue",
                str(turn.exit_code),
                f"{turn.seconds:.1f}s",
                f"{turn.http_requests}/{turn.upstream_requests}",
                (turn.session_id or "-")[:8],
                turn.tool_uses(),
                f"{target}: " + ("yes" if created.exists() else "NO"),
                turn.outcome(),
            ]
        )
    print(table(rows, ["turn", "how", "exit", "time", "http/upstream", "session", "tool uses", "file", "outcome"]))
    for turn in turns:
        print(f"turn {turn.number} result: {short(str(turn.result().get('result', '')), 160)!r}")
        for error in turn.tool_errors()[:4]:
            print(f"    tool error: {short(error, 300)}")
        lines = turn.stderr.splitlines()
        noisy = [line for line in lines if ERROR_LINE.search(line)]
        if noisy or (lines and turn.exit_code != 0):
            shown = noisy or lines[-8:]
            print(f"turn {turn.number} stderr ({len(noisy)} error-like lines of {len(lines)}):")
            for line in shown[:8]:
                print(f"    {short(line, 300)}")
        others = [e for e in turn.events if e.get("type") == "non-json"]
        if others:
            print(f"turn {turn.number} non-JSON stdout lines: {len(others)}, first {short(others[0]['text'], 200)!r}")
    for name in ["hello.txt", *(f"turn{n}.txt" for n in range(2, len(turns) + 1))]:
        path = workdir / name
        print(f"{name}: {repr(path.read_text()) if path.exists() else 'missing'}")


def report_proxy(url: str, exchanges: list[HttpExchange]) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        sessions = client.get("/sessions", params={"limit": 500}).json()["data"]
        print(f"\n== GET /sessions: {len(sessions)} session(s)")
        rows = []
        for session in sessions:
            detail = client.get(f"/sessions/{session['id']}").json()
            usage = detail.get("usage") or {}
            rows.append(
                [
                    short(session["id"], 48),
                    str(session["message_count"]),
                    str(session["history_tokens"]),
                    str(session["summaries"]),
                    str(usage.get("summaries_in_context", "-")),
                    f"{usage.get('context_tokens', '-')}/{usage.get('budget', '-')}",
                ]
            )
        print(table(rows, ["session", "messages", "history tokens", "summaries", "in context", "context/budget"]))
        steps: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = client.get("/journal", params={"limit": 500, "offset": offset}).json()
            steps.extend(page["data"])
            offset += len(page["data"])
            if not page["has_more"] or not page["data"]:
                break
    statuses = Counter(str(step.get("status")) for step in steps)
    posts = sum(1 for e in exchanges if e.method == "POST" and e.path.split("?")[0] == "/v1/messages")
    print(f"\n== GET /journal: {len(steps)} step(s) {dict(statuses)}; Claude Code sent {posts} POST /v1/messages")
    for step in sorted(steps, key=lambda s: s["step_id"]):
        calls = [call["function"]["name"] for call in step.get("tool_calls") or []]
        what = f"calls {','.join(calls)}" if calls else repr(short(step.get("content") or "", 50))
        error = f" error={short(json.dumps(step['error']), 200)}" if step.get("error") else ""
        session = short(str(step.get("session_id", "-")), 12)
        finish = step.get("finish_reason")
        print(f"  step {step['step_id']}: {step['status']} session={session} finish={finish} {what}{error}")


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
    parser.add_argument("--dump", type=Path, help="write the Messages request bodies here as JSON lines")
    args = parser.parse_args(argv)
    claude = find_claude(args.claude)

    tap = LogTap()
    logging.getLogger().addHandler(tap)
    tmp = Path(tempfile.mkdtemp(prefix="bench-claude-"))
    workdir, home = tmp / "work", tmp / "home"
    workdir.mkdir()
    home.mkdir()
    script = Script(workdir)
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
            proxy = Proxy(raw, tmp)
            query_tap = QueryTap(proxy.recorder.app, proxy.recorder)
            proxy.recorder.app = query_tap
            with proxy:
                env = claude_env(home, proxy.url, models, args.plain, args.max_output_tokens)
                betas = "plain (experimental betas off)" if args.plain else "default betas"
                limit = f"max output {args.max_output_tokens or 'default'}"
                print(f"claude: {' '.join(claude)}; window {args.window}; {betas}; {limit}; workdir {workdir}")
                turns: list[ClaudeTurn] = []
                for number, prompt in enumerate(prompts(args.turns), 1):
                    before, http_before = len(fake.requests), len(proxy.recorder.exchanges)
                    code, seconds, events, stderr = run_claude(claude, env, workdir, prompt, resume=number > 1)
                    http = len(proxy.recorder.exchanges) - http_before
                    turn = ClaudeTurn(number, prompt, code, seconds, events, stderr, http, len(fake.requests) - before)
                    turns.append(turn)
                    if code != 0 and number == 1 and not turn.result():
                        print(f"turn 1 failed (exit {code}); stopping. stderr tail: {short(stderr[-800:], 800)}")
                        break
                if args.dump is not None:
                    bodies = (e.request_body.decode("utf-8", "replace") for e in proxy.recorder.exchanges)
                    args.dump.write_text("".join(body + "\n" for body in bodies if body))
                report_http(proxy.recorder.exchanges, query_tap.count_answers)
                report_upstream(fake, script.answers)
                report_turns(turns, workdir)
                report_proxy(proxy.url, proxy.recorder.exchanges)
        print(f"\n== proxy warnings/errors logged: {len(tap.lines)}")
        for line in tap.lines[:15]:
            print(f"  {line}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
