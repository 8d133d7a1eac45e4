"""The real Codex CLI through the Responses door: a scripted multi-turn task on a small fake model.

`codex exec` (0.169.0, see docs/research/responses.md section 3) talks to the proxy served in-process, which
forwards to the fake chat-completions upstream (tests/support/fake_upstream.py) whose responder plays the model: on a
user prompt it calls `exec_command` (`ls -la`), on that result it calls the custom tool `apply_patch` to add the
file the prompt names, on that result it answers "Done: created <file>." Turn 1 is a new thread; the next turns
resume it (`codex exec resume <thread id>`), so the whole task is one Codex thread and, for the proxy, one
session. The window is small (8k by default) so that Codex's system prompt and tools plus a few turns make the
proxy compact; the proxy's summarizer requests go to the same fake and get a fact-keeping summary.

Printed: every HTTP request Codex made to the proxy (from an ASGI recorder around the app, with the body of any
4xx/5xx), every request the fake upstream received (messages, roles, tools, whether tool calls and results pair
up, what the scripted model answered), every Codex turn (exit code, items, outcome, whether the file exists,
error lines from Codex's stderr), then the proxy's `GET /sessions` and `GET /journal`.

Run by hand: `python bench/codex.py [--codex PATH] [--window N] [--turns N] [--keep] [--dump FILE]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import uvicorn

from proxy.app import create_app
from proxy.config import parse_config
from proxy.server import server_options
from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.proxy_server import HOST, free_port, make_config
from tests.support.scripted_session import fact_keeping_summary, is_summarizer_request

MODEL = "gpt-5.5"
DEFAULT_WINDOW = 8_000
MAX_OUTPUT = 1024
DEFAULT_TURNS = 4
CODEX_TIMEOUT_S = 180.0
START_TIMEOUT_S = 20.0
DEFAULT_CODEX_PATHS = (
    Path("/tmp/codexinst/node_modules/.bin/codex"),
    Path("/tmp/codexinst/node_modules/@openai/codex/bin/codex.js"),
)
CODEX_COMPACTION_MARK = "CONTEXT CHECKPOINT COMPACTION"
FILE_NAME = re.compile(r"\b([\w-]+\.txt)\b")
ERROR_LINE = re.compile(r"error|warn|retry|status|40\d|50\d|failed", re.IGNORECASE)
ROLE_ABBREV = {"system": "S", "developer": "D", "user": "U", "assistant": "A", "tool": "T"}
NOISE = ("could not create PATH aliases",)
"""Codex stderr lines that are not about the proxy."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def prompts(turns: int) -> list[str]:
    first = "List the files here, then create hello.txt containing a greeting."
    rest = [f"Now list the files again and create turn{n}.txt as well." for n in range(2, turns + 1)]
    return [first, *rest]


# --- what Codex asked of the proxy -------------------------------------------------------------------------------


@dataclass
class HttpExchange:
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    request_body: bytes = b""
    response_body: bytes = b""
    """Kept for error statuses only."""


@dataclass
class Recorder:
    """An ASGI middleware that remembers every HTTP request to the proxy and its status."""

    app: ASGIApp
    exchanges: list[HttpExchange] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        exchange = HttpExchange(scope["method"], scope["path"], headers)
        self.exchanges.append(exchange)
        body = bytearray()

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body" and exchange.status >= 400:
                exchange.response_body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            exchange.request_body = bytes(body)


class Proxy:
    """The proxy app behind the recorder, on uvicorn in a thread (as tests/support/proxy_server.py serves it)."""

    def __init__(self, raw_config: dict[str, Any], base_dir: Path) -> None:
        config = parse_config(raw_config, base_dir=base_dir, environ=os.environ)
        self.recorder = Recorder(create_app(config))
        self.port = free_port()
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.recorder,
                host=HOST,
                port=self.port,
                log_level="warning",
                lifespan="on",
                log_config=None,
                loop="asyncio",
                **server_options(config.server),
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> Proxy:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(15)


class LogTap(logging.Handler):
    """Warnings and errors the proxy logged while the bench ran."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:300])


# --- the scripted model ------------------------------------------------------------------------------------------


@dataclass
class Script:
    """The fake upstream's responder: the model's side of the task, and a note of what it answered."""

    command_arguments: Callable[[str], dict[str, Any]] = lambda cmd: {"cmd": cmd}
    answers: list[str] = field(default_factory=list)
    calls: int = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply, note = self._reply(body)
        self.answers.append(note)
        return reply

    def _call(self, name: str, arguments: dict[str, Any]) -> Reply:
        self.calls += 1
        function = {"name": name, "arguments": json.dumps(arguments)}
        call: dict[str, Any] = {"id": f"call_bench{self.calls}", "type": "function", "function": function}
        return Reply(tool_calls=[call], finish_reason="tool_calls")

    def _reply(self, body: dict[str, Any]) -> tuple[Reply, str]:
        if is_summarizer_request(body):
            return fact_keeping_summary(body), "summary (proxy summarizer)"
        messages: list[dict[str, Any]] = body.get("messages") or []
        last = messages[-1] if messages else {}
        named = requested_file(messages)
        target = named or "hello.txt"
        lost = "" if named else "; NO prompt naming a file in context"
        if last.get("role") == "user":
            if CODEX_COMPACTION_MARK in content_text(last.get("content")):
                return Reply(
                    content=f"Summary: the user asked for {target}; work in progress."
                ), "text (Codex compaction)"
            return self._call("exec_command", self.command_arguments("ls -la")), "call exec_command"
        if last.get("role") == "tool":
            name = called_name(messages, last.get("tool_call_id"))
            if name == "exec_command":
                patch = f"*** Begin Patch\n*** Add File: {target}\n+hello from the proxy\n*** End Patch\n"
                return self._call("apply_patch", {"input": patch}), f"call apply_patch{lost}"
            return Reply(content=f"Done: created {target}."), f"text (after {name}{lost})"
        return Reply(content="OK."), f"text (last role {last.get('role')})"


def requested_file(messages: list[dict[str, Any]]) -> str | None:
    """The .txt file the latest user message naming one asks for; None if no message in context names one."""
    for message in reversed(messages):
        if message.get("role") == "user":
            match = FILE_NAME.search(content_text(message.get("content")))
            if match:
                return match.group(1)
    return None


def called_name(messages: list[dict[str, Any]], call_id: Any) -> str:
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call.get("id") == call_id:
                return str(call["function"]["name"])
    return "?"


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


def pairing_problem(messages: list[dict[str, Any]]) -> str | None:
    """Why the chat messages' tool calls and tool results do not pair up (the fake's rule), or None."""
    open_ids: set[str] | None = None
    unanswered: list[str] = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            if open_ids is None or message.get("tool_call_id") not in open_ids:
                return f"tool message {index} answers no open call"
            if message["tool_call_id"] in unanswered:
                unanswered.remove(message["tool_call_id"])
            continue
        if unanswered:
            return f"calls {unanswered} unanswered before message {index}"
        open_ids = None
        if message.get("role") == "assistant" and message.get("tool_calls"):
            unanswered = [call["id"] for call in message["tool_calls"]]
            open_ids = set(unanswered)
    return f"calls {unanswered} unanswered at the end" if unanswered else None


def roles_run(messages: list[dict[str, Any]]) -> str:
    """Roles as letters, runs compressed: `S D U2 A T A T`."""
    runs: list[list[Any]] = []
    for message in messages:
        letter = ROLE_ABBREV.get(str(message.get("role")), "?")
        if runs and runs[-1][0] == letter:
            runs[-1][1] += 1
        else:
            runs.append([letter, 1])
    return " ".join(letter if count == 1 else f"{letter}{count}" for letter, count in runs)


# --- Codex -------------------------------------------------------------------------------------------------------


def find_codex(given: str | None) -> list[str]:
    candidates = [Path(given)] if given else [*DEFAULT_CODEX_PATHS]
    if not given and (on_path := shutil.which("codex")):
        candidates.append(Path(on_path))
    for path in candidates:
        if path.exists():
            resolved = path.resolve()
            return ["node", str(resolved)] if resolved.suffix == ".js" else [str(path)]
    where = given or ", ".join(str(p) for p in DEFAULT_CODEX_PATHS) + " or PATH"
    sys.exit(f"codex not found at {where}; install it: npm install --prefix /tmp/codexinst @openai/codex")


def write_codex_home(home: Path, proxy_url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "ctx"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "[model_providers.ctx]\n"
        'name = "Context Infinity"\n'
        f'base_url = "{proxy_url}/v1"\n'
        'env_key = "CTX_KEY"\n'
        'wire_api = "responses"\n'
        "stream_max_retries = 0\n"
        "request_max_retries = 0\n"
    )


@dataclass
class CodexTurn:
    number: int
    prompt: str
    exit_code: int
    seconds: float
    events: list[dict[str, Any]]
    stderr: str
    http_requests: int
    """Requests Codex made to the proxy during the turn."""
    upstream_requests: int
    """Requests the fake upstream received during the turn (the proxy's summarizer calls included)."""

    @property
    def thread_id(self) -> str | None:
        for event in self.events:
            if event.get("type") == "thread.started":
                return str(event.get("thread_id"))
        return None

    def outcome(self) -> str:
        for event in reversed(self.events):
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
            str((event.get("item") or {}).get("type")) for event in self.events if event.get("type") == "item.completed"
        )
        return ", ".join(f"{kind}×{count}" for kind, count in kinds.items()) or "-"

    def last_message(self) -> str:
        for event in reversed(self.events):
            item = event.get("item") or {}
            if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                return str(item.get("text", ""))
        return ""


def run_codex(
    codex: list[str], home: Path, workdir: Path, prompt: str, thread_id: str | None
) -> tuple[int, float, list[dict[str, Any]], str]:
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json", "-m", MODEL]
    args = [*codex, "exec", "resume", *flags, thread_id, prompt] if thread_id else [*codex, "exec", *flags, prompt]
    env = {**os.environ, "CODEX_HOME": str(home), "CTX_KEY": "dummy", "NO_COLOR": "1"}
    started = time.monotonic()
    try:
        done = subprocess.run(
            args,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CODEX_TIMEOUT_S,
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


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def codex_kind(exchange: HttpExchange) -> str:
    try:
        metadata = json.loads(exchange.headers.get("x-codex-turn-metadata", "{}"))
    except ValueError:
        metadata = {}
    return str(metadata.get("request_kind", "-")) if isinstance(metadata, dict) else "-"


def report_http(exchanges: list[HttpExchange]) -> None:
    print("\n== HTTP requests Codex made to the proxy")
    rows = []
    for index, exchange in enumerate(exchanges, 1):
        try:
            items = len(json.loads(exchange.request_body).get("input") or [])
        except (ValueError, AttributeError):
            items = 0
        rows.append(
            [
                str(index),
                f"{exchange.method} {exchange.path}",
                str(exchange.status),
                codex_kind(exchange),
                exchange.headers.get("x-codex-window-id", "-").rsplit(":", 1)[-1],
                str(items),
                f"{len(exchange.request_body) // 1024} KB",
            ]
        )
    print(table(rows, ["#", "request", "status", "kind", "window", "input items", "body"]))
    others = Counter(f"{e.method} {e.path}" for e in exchanges if (e.method, e.path) != ("POST", "/v1/responses"))
    print(f"other than POST /v1/responses: {dict(others) or 'none'}")
    for index, exchange in enumerate(exchanges, 1):
        if exchange.status >= 400:
            print(f"  #{index} {exchange.status} body: {short(exchange.response_body.decode('utf-8', 'replace'), 600)}")


def report_upstream(fake: FakeUpstream, answers: list[str]) -> None:
    print("\n== Requests the fake upstream received (S system, D developer, U user, A assistant, T tool)")
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
                str(len(messages)),
                str(fake.prompt_tokens(messages)),
                roles_run(messages),
                tools_cell(tools, first_tools),
                "ok" if problem is None else f"BROKEN: {problem}",
                answers[index - 1] if index <= len(answers) else "(refused)",
            ]
        )
    print(table(rows, ["#", "msgs", "tokens", "roles", "tools", "pairing", "scripted answer"]))
    print(f"refused by the fake: {len(fake.rejected)}")
    for body in fake.rejected:
        print(f"  {short(json.dumps(body), 400)}")


def tools_cell(tools: list[str], first: list[str] | None) -> str:
    if not tools:
        return "none"
    return f"{len(tools)} (T1)" if tools == first else f"{len(tools)}: {','.join(tools)}"


def report_turns(turns: list[CodexTurn], workdir: Path) -> None:
    print("\n== Codex turns")
    rows = []
    for turn in turns:
        target = requested_file([{"role": "user", "content": turn.prompt}]) or "hello.txt"
        created = workdir / target
        rows.append(
            [
                str(turn.number),
                "new" if turn.number == 1 else "resume",
                str(turn.exit_code),
                f"{turn.seconds:.1f}s",
                f"{turn.http_requests}/{turn.upstream_requests}",
                turn.items(),
                f"{target}: " + ("yes" if created.exists() else "NO"),
                turn.outcome(),
            ]
        )
    print(table(rows, ["turn", "thread", "exit", "time", "http/upstream", "items", "file", "outcome"]))
    for turn in turns:
        print(f"turn {turn.number} last agent message: {short(turn.last_message(), 120)!r}")
        noisy = [
            line for line in turn.stderr.splitlines() if ERROR_LINE.search(line) and not any(n in line for n in NOISE)
        ]
        if noisy:
            print(f"turn {turn.number} stderr ({len(noisy)} error-like lines of {len(turn.stderr.splitlines())}):")
            for line in noisy[:8]:
                print(f"    {short(line, 300)}")
    hello = workdir / "hello.txt"
    if hello.exists():
        print(f"hello.txt contents: {hello.read_text()!r}")


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
                    short(session["id"], 40),
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
    posts = sum(1 for e in exchanges if (e.method, e.path) == ("POST", "/v1/responses"))
    print(f"\n== GET /journal: {len(steps)} step(s) {dict(statuses)}; Codex sent {posts} POST /v1/responses")
    for step in sorted(steps, key=lambda s: s["step_id"]):
        calls = [call["function"]["name"] for call in step.get("tool_calls") or []]
        what = f"calls {','.join(calls)}" if calls else repr(short(step.get("content") or "", 50))
        error = f" error={short(json.dumps(step['error']), 200)}" if step.get("error") else ""
        print(f"  step {step['step_id']}: {step['status']} finish={step.get('finish_reason')} {what}{error}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--codex", help="the codex executable (default: /tmp/codexinst, then PATH)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="the model's context window")
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS, help="Codex turns in the thread")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
    parser.add_argument("--dump", type=Path, help="write the upstream's request bodies here as JSON lines")
    args = parser.parse_args(argv)
    codex = find_codex(args.codex)

    tap = LogTap()
    logging.getLogger().addHandler(tap)
    tmp = Path(tempfile.mkdtemp(prefix="bench-codex-"))
    workdir, home = tmp / "work", tmp / "codex-home"
    workdir.mkdir()
    script = Script()
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
            with Proxy(raw, tmp) as proxy:
                write_codex_home(home, proxy.url)
                print(f"codex: {' '.join(codex)}; window {args.window}; workdir {workdir}")
                turns: list[CodexTurn] = []
                thread_id: str | None = None
                for number, prompt in enumerate(prompts(args.turns), 1):
                    before, http_before = len(fake.requests), len(proxy.recorder.exchanges)
                    code, seconds, events, stderr = run_codex(codex, home, workdir, prompt, thread_id)
                    if number == 1 and fake.requests:
                        script.command_arguments = command_arguments_for(fake.requests[0].body.get("tools") or [])
                    http = len(proxy.recorder.exchanges) - http_before
                    turn = CodexTurn(number, prompt, code, seconds, events, stderr, http, len(fake.requests) - before)
                    turns.append(turn)
                    thread_id = thread_id or turn.thread_id
                    if thread_id is None:
                        print(f"turn {number}: no thread id; stopping. stderr tail: {short(stderr[-800:], 800)}")
                        break
                exec_tool = next(
                    (
                        tool
                        for tool in (fake.requests[0].body.get("tools") or [] if fake.requests else [])
                        if (tool.get("function") or {}).get("name") == "exec_command"
                    ),
                    None,
                )
                if exec_tool is not None:
                    required = exec_tool["function"].get("parameters", {}).get("required")
                    print(f"exec_command schema: required={required}; thread {thread_id}")
                if args.dump is not None:
                    args.dump.write_text("".join(json.dumps(r.body) + "\n" for r in fake.requests))
                report_http(proxy.recorder.exchanges)
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
