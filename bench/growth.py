"""Whether the proxy's own time per request grows with an agent session's length: a long tool-using session
replayed in-process, timed turn by turn.

The marathons (bench/harness/marathon.py) run real CLIs for ~100 turns at several seconds each; this replays the
same shape of session for as many turns as asked in a few minutes. Each turn is two requests through the served
app (in-process, `httpx.ASGITransport`): the user's prompt, answered by a call of the shell tool, then the tool's
output (`--tool-output-tokens`, lines like the marathon's `seq`), answered by text. The client re-sends its whole
conversation every request, in its door's API, with the answers as the door rendered them (Codex-like Responses
input items, Claude Code-like Messages blocks, or chat messages), and a system prompt and tools of about
`--preamble-tokens`. With `--socket` (Responses only) each turn is Codex's over its WebSocket (0.171.0, with its
OpenAI provider): a new socket per turn (`InProcessSocket`, the app's own WebSocket route in-process), the whole
input first, then the tool's output alone continuing that response (`previous_response_id`). The model is
in-process too, at the upstream seam (`proxy.upstream.protocol.Upstream`):
it answers at once, so a request's time is the proxy's own. The summarizer (a separate `summarizer` model,
`context.summarizer_model`) answers a short summary. Pre-compaction runs in the background as served; the bench
waits for it before each turn, so what it does after a turn's requests are answered is counted in neither column.

Per window of `--window-turns` turns: the mean and the least time per turn (both requests) at the client, the
median of the process's CPU per turn (the client's own encoding of its body taken out of both), and the session's
length then. On a machine others share, the least time and the median CPU move least from run to run. With
`--profile TURNS` (comma-separated turn numbers), the turns starting there, `--window-turns` of them, are run
under cProfile (the event loop's thread; worker threads are not seen; a coroutine counts a call per resumption)
and the top functions by cumulative time printed, to compare an early window with a late one.

Run by hand: `python bench/growth.py [--door responses|messages|chat] [--socket] [--turns 300] [--window 32768]
[--window-turns 10] [--stream] [--profile 10,290] [--json PATH]`; `--parse-lengths 30,300,1000` times only the
door's parse of a request re-sending the session, at those lengths. Growth shows as the later windows' ms per turn
over the first's; flat is ~1.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import math
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

# Run as a script from a checkout that is not installed: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.report import Report, add_json_option, columns
from proxy.canonical.types import Chunk
from proxy.config.schema import parse_config
from proxy.serving import app as served
from proxy.serving import services
from proxy.upstream.protocol import UpstreamCall

MAIN = "agent"
SUMMARIZER = "summarizer"
ROW = "turn {turn} row {row}: alpha beta gamma delta epsilon zeta eta theta"
TOKENS_PER_ROW = 17
SHELL = "shell"
FILLER = (
    "You are a coding agent. Read the repository, run commands with the shell tool, keep changes small, "
    "explain what you did. "
)
DOORS = ("responses", "messages", "chat")
PATHS = {"responses": "/v1/responses", "messages": "/v1/messages", "chat": "/v1/chat/completions"}
SHELL_PARAMETERS = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "the command line"}},
    "required": ["command"],
}


def tool_output(turn: int, tokens: int) -> str:
    return "\n".join(ROW.format(turn=turn, row=row) for row in range(1, max(1, tokens // TOKENS_PER_ROW) + 1))


class InstantModel:
    """The upstream seam, answering at once: a shell call on a turn's prompt, the output's last line on its
    result, a short summary to the summarizer. It stands in for `UpstreamRouter` (`services.UpstreamRouter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls = 0
        self.summaries = 0

    def model_info(self, model: str) -> Mapping[str, Any] | None:
        return None

    def warn_missing_keys(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _answer(self, call: UpstreamCall) -> dict[str, Any]:
        self.calls += 1
        if call.entry.name == SUMMARIZER:
            self.summaries += 1
            return {"role": "assistant", "content": "Summary: the user asked for commands; each was run. " * 8}
        last = call.messages[-1]
        if last.get("role") == "tool":
            lines = str(last.get("content") or "").splitlines() or ["(no output)"]
            return {"role": "assistant", "content": f"The last line is: {lines[-1]}"}
        prompt = str(last.get("content") or "")
        turn = prompt.split(":", 1)[0].removeprefix("Turn ")
        arguments = json.dumps({"command": f"print turn {turn}"})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"call_{turn}", "type": "function", "function": {"name": SHELL, "arguments": arguments}}
            ],
        }

    async def complete(self, call: UpstreamCall) -> Chunk:
        message = self._answer(call)
        return {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": call.entry.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
            ],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020},
        }

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        message = self._answer(call)
        delta: dict[str, Any] = {"role": "assistant"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
        else:
            delta["content"] = message["content"]
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        base = {"id": f"chatcmpl-{self.calls}", "object": "chat.completion.chunk", "created": 1, "model": "m"}

        async def chunks() -> AsyncIterator[Chunk]:
            yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            yield {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020},
            }

        return chunks()


class Client:
    """An agent re-sending its whole conversation in one door's API."""

    def __init__(self, door: str, preamble_tokens: int, stream: bool, developer: bool = False) -> None:
        """`developer`: the system prompt is the input's first item, a developer message, as Codex sends it."""
        self.door = door
        self.stream = stream
        self.system = (FILLER * max(1, preamble_tokens // 2 // 24)).strip()
        self.tool_text = "Runs a shell command and returns its output. " * max(1, preamble_tokens // 2 // 10)
        self.history: list[dict[str, Any]] = []
        self.developer = developer
        if developer:
            text = [{"type": "input_text", "text": self.system}]
            self.history.append({"type": "message", "role": "developer", "content": text})

    def user(self, text: str) -> None:
        if self.door == "responses":
            self.history.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        else:
            self.history.append({"role": "user", "content": text})

    def body(self) -> dict[str, Any]:
        if self.door == "responses":
            tools = [{"type": "function", "name": SHELL, "description": self.tool_text, "parameters": SHELL_PARAMETERS}]
            instructions = {} if self.developer else {"instructions": self.system}
            return {
                "model": MAIN, **instructions, "input": self.history, "tools": tools, "stream": self.stream,
                "store": False,
            }  # fmt: skip
        if self.door == "messages":
            tools = [{"name": SHELL, "description": self.tool_text, "input_schema": SHELL_PARAMETERS}]
            return {
                "model": MAIN, "system": self.system, "messages": self.history, "tools": tools,
                "max_tokens": 1024, "stream": self.stream,
            }  # fmt: skip
        tools = [{"type": "function", "function": {"name": SHELL, "description": self.tool_text,
                                                   "parameters": SHELL_PARAMETERS}}]  # fmt: skip
        return {
            "model": MAIN, "messages": [{"role": "system", "content": self.system}, *self.history], "tools": tools,
            "stream": self.stream,
        }  # fmt: skip

    def answered(self, payload: Mapping[str, Any]) -> str | None:
        """Append the answer (its non-stream shape) as the client keeps it; the shell call's id, if the model
        called it."""
        if self.door == "responses":
            output = [item for item in payload["output"] if item.get("type") != "reasoning"]
            self.history.extend(output)
            return next((item["call_id"] for item in output if item.get("type") == "function_call"), None)
        if self.door == "messages":
            content = payload["content"]
            self.history.append({"role": "assistant", "content": content})
            return next((block["id"] for block in content if block.get("type") == "tool_use"), None)
        message = payload["choices"][0]["message"]
        self.history.append({key: value for key, value in message.items() if value is not None})
        calls = message.get("tool_calls") or []
        return str(calls[0]["id"]) if calls else None

    def result(self, call_id: str, text: str) -> None:
        if self.door == "responses":
            self.history.append({"type": "function_call_output", "call_id": call_id, "output": text})
        elif self.door == "messages":
            self.history.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}
            )
        else:
            self.history.append({"role": "tool", "tool_call_id": call_id, "content": text})


def streamed(door: str, text: str) -> dict[str, Any]:
    """The non-stream shape of a streamed answer, from its last events (enough for this bench's answers)."""
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    events = [event for event in events if isinstance(event, dict)]
    if door == "responses":
        done = next(event for event in reversed(events) if event.get("type") == "response.completed")
        return dict(done["response"])
    if door == "messages":
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, str] = {}
        for event in events:
            kind = event.get("type")
            if kind == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"])
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta.get("type") == "text_delta":
                    blocks[event["index"]]["text"] = blocks[event["index"]].get("text", "") + delta["text"]
                elif delta.get("type") == "input_json_delta":
                    partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        for index, raw in partial.items():
            blocks[index]["input"] = json.loads(raw or "{}")
        return {"content": [blocks[index] for index in sorted(blocks)]}
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: list[dict[str, Any]] = []
    for event in events:
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            message["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                calls.append({"id": call["id"], "type": "function", "function": call["function"]})
    if calls:
        message["tool_calls"] = calls
        message["content"] = message["content"] or None
    return {"choices": [{"message": message}]}


class InProcessSocket:
    """A WebSocket to the app in-process: its ASGI messages through two queues, as uvicorn would pass them."""

    def __init__(self, app: Any, path: str, headers: Mapping[str, str]) -> None:
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        scope = {
            "type": "websocket", "asgi": {"version": "3.0"}, "scheme": "ws", "http_version": "1.1", "path": path,
            "raw_path": path.encode(), "root_path": "", "query_string": b"", "server": ("bench", 80),
            "client": ("127.0.0.1", 1), "subprotocols": [],
            "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        }  # fmt: skip
        self._served = asyncio.ensure_future(app(scope, self._inbox.get, self._outbox.put))

    @classmethod
    async def open(cls, app: Any, path: str, headers: Mapping[str, str]) -> InProcessSocket:
        socket = cls(app, path, headers)
        await socket._inbox.put({"type": "websocket.connect"})
        accepted = await socket._outbox.get()
        if accepted["type"] != "websocket.accept":
            raise RuntimeError(f"the socket was refused: {accepted}")
        return socket

    async def ask(self, raw: bytes) -> dict[str, Any]:
        """The `response` of the `response.completed` event answering `raw`."""
        await self._inbox.put({"type": "websocket.receive", "text": raw.decode()})
        while True:
            message = await self._outbox.get()
            event = json.loads(message.get("text") or "{}")
            if event.get("type") == "response.completed":
                return dict(event["response"])
            if event.get("type") in ("error", "response.failed", "response.incomplete"):
                raise RuntimeError(f"the socket answered {str(event)[:500]}")

    async def close(self) -> None:
        await self._inbox.put({"type": "websocket.disconnect", "code": 1000})
        await self._served


def config_for(tmp: Path, window: int) -> Any:
    common = {"api_base": "http://127.0.0.1:9", "api_key": "k", "context_window": window}
    raw = {
        "store": {"path": str(tmp / "store.db")},
        "models": [
            {"name": MAIN, "model": "openai/bench-model", **common},
            {"name": SUMMARIZER, "model": "openai/bench-summarizer", **common},
        ],
        "context": {"summarizer_model": SUMMARIZER},
    }
    return parse_config(raw, base_dir=tmp, environ={})


async def replay(args: argparse.Namespace, report: Report) -> None:
    profiled = {int(turn) for turn in args.profile.split(",") if turn} if args.profile else set()
    table = report.table(
        "growth",
        f"per window of {args.window_turns} turns: the proxy's time per turn (two requests), its CPU, the session",
        columns(
            ("turns", "turns"), ("messages", "msgs"), ("ms_per_turn", "ms/turn", ".1f"), ("min_ms", "min ms", ".1f"),
            ("cpu_ms_per_turn", "cpu ms/turn", ".1f"), ("summaries", "summ"),
        ),
    )  # fmt: skip
    model = InstantModel()
    services.UpstreamRouter = lambda *a, **k: model  # type: ignore[assignment,misc]  # the seam, for this run
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        app = served.create_app(config_for(Path(tmp), args.window))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            compactor = app.state.services.pipeline.compactor
            async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as http:
                client = Client(args.door, args.preamble_tokens, args.stream, developer=args.socket)
                headers = {
                    "x-api-key": "k", "authorization": "Bearer k", "anthropic-version": "2023-06-01",
                    "content-type": "application/json",
                }  # fmt: skip

                client_s = client_cpu = 0.0
                """The client's own time and CPU (encoding the growing body): taken out of the request's."""

                async def send(body: Mapping[str, Any], socket: InProcessSocket | None = None) -> dict[str, Any]:
                    """The answer to `body`, in its non-stream shape: over HTTP, or on `socket`."""
                    nonlocal client_s, client_cpu
                    encoding, encoding_cpu = time.perf_counter(), time.process_time()
                    raw = json.dumps({"type": "response.create", **body} if socket else body).encode()
                    client_s += time.perf_counter() - encoding
                    client_cpu += time.process_time() - encoding_cpu
                    if socket is not None:
                        return await socket.ask(raw)
                    response = await http.post(PATHS[args.door], content=raw, headers=headers)
                    if response.status_code != 200:
                        raise RuntimeError(f"{response.status_code}: {response.text[:500]}")
                    return streamed(args.door, response.text) if args.stream else dict(response.json())

                walls: list[float] = []
                cpus: list[float] = []
                profiler: cProfile.Profile | None = None
                for turn in range(1, args.turns + 1):
                    if turn in profiled:
                        profiler = cProfile.Profile()
                    await compactor.settled()
                    started, started_cpu = time.perf_counter(), time.process_time()
                    client_s = client_cpu = 0.0
                    if profiler is not None:
                        profiler.enable()
                    client.user(f"Turn {turn}: run the command and tell me its last line.")
                    if args.socket:
                        # Codex's turn: a new socket, the whole input, then the tool's output continuing the answer.
                        socket = await InProcessSocket.open(app, PATHS[args.door], headers)
                        body = {key: value for key, value in client.body().items() if key != "stream"}
                        answer = await send(body, socket)
                        call_id = client.answered(answer)
                        if call_id is None:
                            raise RuntimeError(f"turn {turn}: the model did not call the shell")
                        client.result(call_id, tool_output(turn, args.tool_output_tokens))
                        body = {**body, "input": client.history[-1:], "previous_response_id": answer["id"]}
                        client.answered(await send(body, socket))
                        await socket.close()
                    else:
                        call_id = client.answered(await send(client.body()))
                        if call_id is None:
                            raise RuntimeError(f"turn {turn}: the model did not call the shell")
                        client.result(call_id, tool_output(turn, args.tool_output_tokens))
                        client.answered(await send(client.body()))
                    if profiler is not None:
                        profiler.disable()
                    walls.append(time.perf_counter() - started - client_s)
                    cpus.append(time.process_time() - started_cpu - client_cpu)
                    if turn % args.window_turns == 0:
                        row = table.add(
                            turns=f"{turn - args.window_turns + 1}-{turn}",
                            messages=len(client.history),
                            ms_per_turn=1000 * statistics.mean(walls),
                            min_ms=1000 * min(walls),
                            cpu_ms_per_turn=1000 * statistics.median(cpus),
                            summaries=model.summaries,
                        )
                        print(
                            f"turns to {turn}: {row['ms_per_turn']:.1f} ms/turn, min {row['min_ms']:.1f} ms, "
                            f"cpu {row['cpu_ms_per_turn']:.1f} ms/turn, {len(client.history)} messages",
                            file=sys.stderr,
                        )
                        walls, cpus = [], []
                        if profiler is not None:
                            report.notes.append(profile_text(profiler, turn, args.profile_lines))
                            profiler = None
    rows = table.rows
    if len(rows) >= 2:
        first = rows[1] if len(rows) > 2 else rows[0]  # the very first window pays imports and first writes
        report.ratios[f"ms per turn, last window / window {first['turns']}"] = round(
            rows[-1]["ms_per_turn"] / first["ms_per_turn"], 2
        )
        report.ratios[f"fastest turn, last window / window {first['turns']}"] = round(
            rows[-1]["min_ms"] / first["min_ms"], 2
        )
        report.ratios[f"CPU per turn (median), last window / window {first['turns']}"] = round(
            rows[-1]["cpu_ms_per_turn"] / first["cpu_ms_per_turn"], 2
        )


PARSE_RUNS = 15


def parse_costs(args: argparse.Namespace, report: Report) -> None:
    """The door's parse of a session's request after the one before it, at each of `--parse-lengths` turns (the
    least of `PARSE_RUNS`): the part of a request's time that reads the client's body."""
    from proxy.config.schema import RequestLimits
    from proxy.doors.chat import parse_chat_request
    from proxy.doors.messages.input import parse_messages_request
    from proxy.doors.resent import ResentLists
    from proxy.doors.responses.input import parse_responses_request

    parsers: dict[str, Callable[..., Any]] = {
        "responses": parse_responses_request, "messages": parse_messages_request, "chat": parse_chat_request,
    }  # fmt: skip
    parse, limits = parsers[args.door], RequestLimits()
    table = report.table(
        "parse",
        f"the {args.door} door's parse of a request re-sending the session, after the request before it",
        columns(("turns",), ("messages", "items"), ("mb", "MB", ".1f"), ("ms", "ms", ".2f")),
    )
    for turns in (int(turn) for turn in args.parse_lengths.split(",")):
        client = Client(args.door, args.preamble_tokens, stream=False)
        before: bytes = b""
        for turn in range(1, turns + 1):
            before = json.dumps(client.body()).encode()
            client.user(f"Turn {turn}: run the command and tell me its last line.")
            call = {"id": f"call_{turn}", "name": SHELL, "arguments": "{}"}
            if args.door == "responses":
                client.history.append({"type": "function_call", "call_id": call["id"], **call, "id": f"fc_{turn}"})
            elif args.door == "messages":
                use = {"type": "tool_use", "id": call["id"], "name": SHELL, "input": {}}
                client.history.append({"role": "assistant", "content": [use]})
            else:
                function = {"name": SHELL, "arguments": "{}"}
                client.history.append({"role": "assistant", "tool_calls": [{"id": call["id"], "type": "function",
                                                                           "function": function}]})  # fmt: skip
            client.result(call["id"], tool_output(turn, args.tool_output_tokens))
        body = json.dumps(client.body()).encode()
        best = math.inf
        for _ in range(PARSE_RUNS):
            lists = ResentLists().of("bench")
            parse(before, limits, lists)
            started = time.perf_counter()
            parse(body, limits, lists)
            best = min(best, time.perf_counter() - started)
        table.add(turns=turns, messages=len(client.history), mb=len(body) / 1e6, ms=1000 * best)


def profile_text(profiler: cProfile.Profile, turn: int, lines: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(lines)
    return f"profile of the window ending at turn {turn}:\n{out.getvalue()}"


def main(argv: list[str] | None = None, run: Callable[..., Any] = asyncio.run) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--door", choices=DOORS, default="responses")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=32_768, help="the model's context window")
    parser.add_argument("--window-turns", type=int, default=10, help="turns per measured window")
    parser.add_argument("--tool-output-tokens", type=int, default=2400)
    parser.add_argument("--preamble-tokens", type=int, default=6000, help="about what system prompt and tools cost")
    parser.add_argument("--stream", action="store_true", help="stream every answer, as the CLIs do")
    parser.add_argument("--socket", action="store_true", help="Responses over a WebSocket per turn, as Codex's")
    parser.add_argument("--profile", default="", help="turn numbers whose window runs under cProfile")
    parser.add_argument("--profile-lines", type=int, default=40)
    parser.add_argument(
        "--parse-lengths", default="", help="instead of the replay: the door's parse at these turns (e.g. 30,300,1000)"
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.socket and args.door != "responses":
        parser.error("--socket is the Responses door's")
    report = Report.start("growth", args)
    if args.parse_lengths:
        parse_costs(args, report)
    else:
        run(replay(args, report))
    report.publish(args.json)


if __name__ == "__main__":
    main()
