"""Driving a real agent CLI (Codex, Claude Code) through the proxy on a scripted fake model, and what to show of it.

The proxy is served in-process by tests/support/proxy_server.py's `ProxyServer`, with a `Recorder` around the
app that keeps every HTTP request the CLI made; the proxy forwards to the fake chat-completions upstream
(tests/support/fake_upstream.py) whose responder is a `ScriptedModel`: the model's side of a small task (list
the files, create the one the prompt names, say so). Each turn runs the CLI once as a child process
(`run_cli`) in a scratch directory, its JSON-lines stdout parsed into events. The tables every agent bench
shows — what the fake upstream received, the proxy's sessions and journal — are built here.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.harness.report import Report, Table, columns
from tests.support.fake_upstream import FakeUpstream, Reply, content_text
from tests.support.scripted_session import fact_keeping_summary, is_summarizer_request

FILE_NAME = re.compile(r"\b([\w-]+\.txt)\b")
ERROR_LINE = re.compile(r"error|warn|retry|status|40\d|50\d|failed", re.IGNORECASE)
ROLE_ABBREV = {"system": "S", "developer": "D", "user": "U", "assistant": "A", "tool": "T"}
FIRST_FILE = "hello.txt"
PAGE_LIMIT = 500
ADMIN_TIMEOUT_S = 10.0
LOG_LINE_CHARS = 300


FACT_KEY = "PROJECT_CODENAME"
FACT_VALUE = "BLUE_HERON_42"
FACT_QUESTION = f"Which {FACT_KEY} did I give you in my first message? Answer with its value only."
"""Asked last: the answer is right only if the first turn still reaches the model (verbatim, in a summary, or
recalled by the proxy)."""
FACT_SEEN = re.compile(re.escape(FACT_KEY) + r"\s*[=:]\s*([A-Z0-9_]+)")


def prompts(turns: int, *, ask_fact: bool = True) -> list[str]:
    """The user's side of the task: one file to create per turn, a fact given first and asked for last."""
    first = f"List the files here, then create {FIRST_FILE} containing a greeting. Note: {FACT_KEY}={FACT_VALUE}."
    rest = [f"Now list the files again and create turn{n}.txt as well." for n in range(2, turns + 1)]
    return [first, *rest, *([FACT_QUESTION] if ask_fact else [])]


def fact_answer(messages: list[dict[str, Any]]) -> Reply | None:
    """The scripted model's answer to the last prompt's question: the value it finds in what it was sent. The
    question is the latest user message, whatever follows it (Claude Code 2.1.197 appends a system reminder
    after the user's turn in a long session)."""
    asked = next((at for at in range(len(messages) - 1, -1, -1) if messages[at].get("role") == "user"), None)
    if asked is None or FACT_QUESTION not in content_text(messages[asked].get("content")):
        return None
    for message in messages[:asked]:
        found = FACT_SEEN.search(content_text(message.get("content")))
        if found:
            return Reply(content=found.group(1))
    return Reply(content="UNKNOWN")


def short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- what the CLI asked of the proxy -------------------------------------------------------------------------


@dataclass
class HttpExchange:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    status: int = 0
    request_body: bytes = b""
    response_body: bytes = b""
    """Kept for error statuses, and for the paths the recorder keeps every answer of."""

    @property
    def target(self) -> str:
        """The path with its query string."""
        return f"{self.path}?{self.query}" if self.query else self.path

    def json(self) -> dict[str, Any]:
        """The request body as a JSON object; empty if it is not one."""
        try:
            body = json.loads(self.request_body)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}


@dataclass
class Recorder:
    """An ASGI middleware that remembers every HTTP request to the proxy, its status, and the answers of error
    statuses and of `keep_answers` paths. Put around the app with `ProxyServer(..., middleware=recorder.around)`."""

    keep_answers: tuple[str, ...] = ()
    exchanges: list[HttpExchange] = field(default_factory=list)
    app: ASGIApp | None = None

    def around(self, app: ASGIApp) -> ASGIApp:
        self.app = app
        return self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None, "the recorder wraps no app"
        if scope["type"] == "websocket":
            socket = HttpExchange("WS", scope["path"], "", {})
            self.exchanges.append(socket)

            async def recording_socket_send(message: Message) -> None:
                if message["type"] == "websocket.accept":
                    socket.status = 101
                elif message["type"] == "websocket.http.response.start":
                    socket.status = message["status"]
                elif message["type"] == "websocket.send":
                    socket.response_body += b"."  # one byte per event sent, to count them
                await send(message)

            await self.app(scope, receive, recording_socket_send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = scope.get("query_string", b"").decode("latin-1")
        exchange = HttpExchange(scope["method"], scope["path"], query, headers)
        self.exchanges.append(exchange)
        keep_all = scope["path"] in self.keep_answers
        body = bytearray()

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body" and (keep_all or exchange.status >= 400):
                exchange.response_body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            exchange.request_body = bytes(body)


class LogTap(logging.Handler):
    """Warnings and errors the in-process proxy logged while the bench ran."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:LOG_LINE_CHARS])


# --- the scripted model --------------------------------------------------------------------------------------


@dataclass
class ScriptedModel:
    """The fake upstream's responder: the model's side of the task, with a note of every answer. The proxy's
    summarizer requests get a fact-keeping summary; a bench's subclass plays the rest in `reply`."""

    call_prefix: str = "call_bench"
    answers: list[str] = field(default_factory=list)
    calls: int = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        fact = fact_answer(body.get("messages") or [])
        if is_summarizer_request(body):
            reply, note = fact_keeping_summary(body), "summary (proxy summarizer)"
        elif fact is not None:
            reply, note = fact, f"fact: {fact.content}"
        else:
            reply, note = self.reply(body)
        self.answers.append(note)
        return reply

    def reply(self, body: dict[str, Any]) -> tuple[Reply, str]:
        raise NotImplementedError

    def call(self, name: str, arguments: dict[str, Any]) -> Reply:
        """A reply calling the tool `name`."""
        self.calls += 1
        function = {"name": name, "arguments": json.dumps(arguments)}
        call: dict[str, Any] = {"id": f"{self.call_prefix}{self.calls}", "type": "function", "function": function}
        return Reply(tool_calls=[call], finish_reason="tool_calls")


def requested_file(messages: list[dict[str, Any]]) -> str | None:
    """The .txt file the latest user message naming one asks for; None if no message in context names one."""
    for message in reversed(messages):
        if message.get("role") == "user":
            named = FILE_NAME.findall(content_text(message.get("content")))
            if named:
                return str(named[-1])  # the prompt comes after the reminders a client puts in the same message
    return None


def called_name(messages: list[dict[str, Any]], call_id: Any) -> str:
    """The name of the tool the call `call_id` called; `?` if no message holds it."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call.get("id") == call_id:
                return str(call["function"]["name"])
    return "?"


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


# --- the CLI -------------------------------------------------------------------------------------------------


def find_cli(given: str | None, defaults: tuple[Path, ...], name: str, install: str) -> list[str]:
    """The argv prefix running the CLI: `given`, else the first of `defaults`, else `name` on PATH; a .js/.cjs
    entry runs under node. Exits with `install` (how to get it) when none exists."""
    candidates = [Path(given)] if given else [*defaults]
    if not given and (on_path := shutil.which(name)):
        candidates.append(Path(on_path))
    for path in candidates:
        if path.exists():
            resolved = path.resolve()
            return ["node", str(resolved)] if resolved.suffix in (".js", ".cjs") else [str(path)]
    where = given or ", ".join(str(p) for p in defaults) + " or PATH"
    sys.exit(f"{name} not found at {where}; install it: {install}")


@dataclass
class CliRun:
    exit_code: int
    """-1: timed out."""
    seconds: float
    events: list[dict[str, Any]]
    """stdout's JSON lines; a line that is not JSON is `{"type": "non-json", "text": line}`."""
    stderr: str


def run_cli(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> CliRun:
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
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
    return CliRun(code, time.monotonic() - started, events, stderr)


@dataclass
class AgentTurn:
    number: int
    prompt: str
    run: CliRun
    http_requests: int
    """Requests the CLI made to the proxy during the turn."""
    upstream_requests: int
    """Requests the fake upstream received during the turn (the proxy's summarizer calls included)."""

    @property
    def target_file(self) -> str:
        return requested_file([{"role": "user", "content": self.prompt}]) or FIRST_FILE

    def created(self, workdir: Path) -> str:
        return f"{self.target_file}: " + ("yes" if (workdir / self.target_file).exists() else "NO")

    def error_lines(self, noise: tuple[str, ...] = ()) -> list[str]:
        """stderr's error-like lines, less the `noise` that is not about the proxy."""
        lines = self.run.stderr.splitlines()
        return [line for line in lines if ERROR_LINE.search(line) and not any(n in line for n in noise)]


# --- what every agent bench shows ----------------------------------------------------------------------------


def tools_cell(tools: list[str], first: list[str] | None) -> str:
    if not tools:
        return "none"
    return f"{len(tools)} (T1)" if tools == first else f"{len(tools)}: {','.join(tools)}"


def upstream_table(report: Report, fake: FakeUpstream, answers: list[str]) -> Table:
    """Every request the fake upstream received: its model, size, roles, tools, whether tool calls and results
    pair up, and what the scripted model answered."""
    table = report.table(
        "upstream",
        "Requests the fake upstream received (S system, D developer, U user, A assistant, T tool)",
        columns(
            ("index", "#"), ("model",), ("messages", "msgs"), ("tokens",), ("max_tokens", "max_tok"), ("roles",),
            ("tools",), ("pairing",), ("answer", "scripted answer"),
        ),
    )  # fmt: skip
    first_tools: list[str] | None = None
    for index, received in enumerate(fake.requests, 1):
        body = received.body
        messages: list[dict[str, Any]] = body.get("messages") or []
        tools = [str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or []]
        problem = pairing_problem(messages)
        if tools and first_tools is None:
            first_tools = tools
            table.notes.append(f"tools offered (T1): {', '.join(tools)}")
        table.add(
            index=index,
            model=body.get("model"),
            messages=len(messages),
            tokens=fake.prompt_tokens(messages),
            max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
            roles=short(roles_run(messages), 40),
            tools=tools_cell(tools, first_tools),
            pairing="ok" if problem is None else f"BROKEN: {problem}",
            answer=answers[index - 1] if index <= len(answers) else "(refused)",
        )
    table.notes.append(f"refused by the fake: {len(fake.rejected)}")
    table.notes.extend(f"  {short(json.dumps(body), 400)}" for body in fake.rejected)
    return table


def proxy_tables(report: Report, url: str, posts: int, door: str) -> None:
    """The proxy's `GET /sessions` (with each session's usage) and `GET /journal`, as two tables; `posts` is how
    many requests the CLI sent to `door`."""
    with httpx.Client(base_url=url, timeout=ADMIN_TIMEOUT_S) as client:
        metrics = client.get("/metrics").text
        answered = [line for line in metrics.splitlines() if line.startswith("context_proxy_client_compactions_total")]
        report.notes.append(f"client compactions answered by the proxy: {answered or 'none'}")
        sessions = client.get("/sessions", params={"limit": PAGE_LIMIT}).json()["data"]
        table = report.table(
            "sessions",
            f"GET /sessions: {len(sessions)} session(s)",
            columns(
                ("session",), ("messages",), ("history_tokens", "history tokens"), ("summaries",),
                ("in_context", "in context"), ("context_tokens", "context"), ("budget",),
            ),
        )  # fmt: skip
        for session in sessions:
            usage = client.get(f"/sessions/{session['id']}").json().get("usage") or {}
            table.add(
                session=short(session["id"], 48),
                messages=session["message_count"],
                history_tokens=session["history_tokens"],
                summaries=session["summaries"],
                in_context=usage.get("summaries_in_context"),
                context_tokens=usage.get("context_tokens"),
                budget=usage.get("budget"),
            )
        steps: list[dict[str, Any]] = []
        while True:
            page = client.get("/journal", params={"limit": PAGE_LIMIT, "offset": len(steps)}).json()
            steps.extend(page["data"])
            if not page["has_more"] or not page["data"]:
                break
    statuses = Counter(str(step.get("status")) for step in steps)
    journal = report.table(
        "journal",
        f"GET /journal: {len(steps)} step(s) {dict(statuses)}; the CLI sent {posts} POST {door}",
        columns(("step",), ("status",), ("session",), ("finish",), ("recalled",), ("what",), ("error",)),
    )
    last = max(steps, key=lambda s: s["step_id"], default=None)
    if last is not None and FACT_VALUE in str(last.get("content")):
        journal.notes.append(f"the question asked last was answered right ({FACT_VALUE})")
    elif last is not None:
        journal.notes.append(f"the question asked last was answered WRONG: {short(str(last.get('content')), 80)!r}")
    for step in sorted(steps, key=lambda s: s["step_id"]):
        calls = [call["function"]["name"] for call in step.get("tool_calls") or []]
        journal.add(
            step=step["step_id"],
            status=step["status"],
            session=short(str(step.get("session_id", "-")), 12),
            finish=step.get("finish_reason"),
            recalled=(step.get("context") or {}).get("recalled"),
            what=f"calls {','.join(calls)}" if calls else repr(short(step.get("content") or "", 50)),
            error=short(json.dumps(step["error"]), 200) if step.get("error") else None,
        )


def log_notes(report: Report, tap: LogTap, shown: int = 15) -> None:
    report.notes.append(f"proxy warnings/errors logged: {len(tap.lines)}")
    report.notes.extend(f"  {line}" for line in tap.lines[:shown])
