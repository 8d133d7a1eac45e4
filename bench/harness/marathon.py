"""The marathon: N tool-using turns of a real agent CLI through the proxy, measured turn by turn (issue 27).

Each turn the user asks the agent to run one shell command whose output is about `tool_output_tokens` long; the
scripted model calls the CLI's shell tool with it, then answers with the output's last line. The first turn
also gives a fact (`FACT_KEY=FACT_VALUE`) that the last turn asks for. The fake upstream (the caching
chat-completions fake) waits `model_latency_s` before each main-model answer and `summarizer_latency_s` before
each of the proxy's summarizer calls (a separate `summarizer` model), and reports OpenAI-style prefix caching.
The proxy runs in its own process, so its CPU time and resident memory are its own.

Per turn: wall time, exit, main-model requests, summarizer calls, upstream rejections, tokens the main model was
sent and the share served from its cache, the proxy's CPU seconds and RSS. Then the headline figures: median
turn, turns more than 1.5 s over it, summarizer calls per 10 turns, cached share, CPU and RSS at turn 20 and at
the last turn and their ratio, the proxy's time before its upstream calls per turn over the same two windows
(`/metrics`, read only at the windows' edges), and its time to a stream's first byte less the upstream's (the
door's parse included), and whether the fact was answered.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

from bench.harness.agents import (
    ADMIN_TIMEOUT_S,
    FACT_KEY,
    FACT_QUESTION,
    FACT_SEEN,
    FACT_VALUE,
    ScriptedModel,
    called_name,
)
from bench.harness.report import Report, add_json_option, columns
from proxy.compaction.client_prompts import recognize
from proxy.compaction.recall import RECALL_HEADER
from tests.support.fake_upstream import (
    FakeUpstream,
    Reply,
    Served,
    content_text,
    prompt_token_ids,
    token_ids,
)
from tests.support.proxy_server import ProxyProcess, make_config
from tests.support.scripted_session import fact_keeping_summary, is_summarizer_request

MAIN_MODEL_ID = "fake-model"
SUMMARIZER_MODEL_ID = "fake-summarizer"
DEFAULT_TOOL_OUTPUT_TOKENS = 2400
DEFAULT_MODEL_LATENCY_S = 0.8
DEFAULT_SUMMARIZER_LATENCY_S = 2.0
SLOW_TURN_S = 1.5
"""A turn this much slower than the median counts as slow (issue 27's bound)."""
MARATHON_TIMEOUT_S = 600.0
"""One CLI turn's limit."""
PROXY_START_TIMEOUT_S = 300.0
"""The proxy process imports LiteLLM before it answers: a minute or more on a loaded 2-core machine."""
EARLY_TURN = 20
"""The turn whose proxy CPU time and RSS the last turn's are compared with."""
CPU_WINDOW = 10
"""Per-turn CPU time is compared as the mean of this many turns (ending at `EARLY_TURN`, and the last ones): one
turn's is a few tens of milliseconds, read in clock ticks."""
COST_KEYS = (
    "sessions",
    "steps",
    "sent_tokens",
    "cached_tokens",
    "cached_share",
    "requested_tokens",
    "summarizer_calls",
)
TURN_PROMPT = re.compile(r"Turn (\d+): run `([^`]+)`")
ROW_TEXT = "turn {turn} row %g: alpha beta gamma delta epsilon zeta eta theta"
PRINTED_ROW = re.compile(r"^turn \d+ row \d+: ")
"""A line the turn's command printed (`ROW_TEXT`), told from what the CLI writes around a tool's output."""


def tool_command(turn: int, tokens: int) -> str:
    """A shell command that prints about `tokens` tokens (lines of `ROW_TEXT`)."""
    sample = ROW_TEXT.format(turn=turn).replace("%g", "100") + "\n"
    lines = max(1, round(tokens / len(token_ids([sample]))))
    return f"seq -f '{ROW_TEXT.format(turn=turn)}' 1 {lines}"


def marathon_prompts(turns: int, tool_output_tokens: int) -> list[str]:
    """`turns` tool-using turns, the fact given in the first, then the fact question."""
    asks = [
        f"Turn {n}: run `{tool_command(n, tool_output_tokens)}` with the shell tool and tell me its last line."
        for n in range(1, turns + 1)
    ]
    asks[0] += f" Note: {FACT_KEY}={FACT_VALUE}."
    return [*asks, FACT_QUESTION]


def marathon_summary(body: dict[str, Any]) -> Reply:
    """A summarizer that keeps `KEY=VALUE` facts, as the proxy's instruction asks a real one to."""
    reply = fact_keeping_summary(body)
    facts = dict.fromkeys(
        f"{FACT_KEY}={m.group(1)}" for m in FACT_SEEN.finditer(content_text(body["messages"][-1].get("content")))
    )
    return Reply(content=f"{reply.content} {' '.join(facts)}".strip())


class MarathonModel(ScriptedModel):
    """On a turn's prompt: call the shell tool (`shell_tool`, its arguments from `arguments`) with the prompt's
    command; on its result: the output's last line; requests without the tool (side requests): "OK."."""

    def __init__(self, shell_tool: str, arguments: Callable[[str, list[dict[str, Any]]], dict[str, Any]]) -> None:
        """`arguments`: the shell tool's arguments for a command, given the tools the request offered."""
        super().__init__(call_prefix="call_marathon")
        self.shell_tool = shell_tool
        self.arguments = arguments

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summarizer_request(body):
            self.answers.append("summary (proxy summarizer)")
            return marathon_summary(body)
        return super().__call__(body)

    def reply(self, body: dict[str, Any]) -> tuple[Reply, str]:
        messages: list[dict[str, Any]] = body.get("messages") or []
        tools = {str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or []}
        if self.shell_tool not in tools:
            return Reply(content="OK."), f"text (side request, {len(tools)} tools)"
        last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        results = [m for m in messages[last_assistant + 1 :] if m.get("role") == "tool"]
        prompt = next(
            (TURN_PROMPT.search(content_text(m.get("content"))) for m in reversed(messages) if m.get("role") == "user"),
            None,
        )
        if results and called_name(messages, results[-1].get("tool_call_id")) == self.shell_tool:
            return Reply(content=f"The last line is: {last_printed_line(results[-1])}"), "text (after shell)"
        if prompt is None:
            return Reply(content="OK."), "text (no turn prompt in context)"
        arguments = self.arguments(prompt.group(2), body.get("tools") or [])
        return self.call(self.shell_tool, arguments), f"call {self.shell_tool} (turn {prompt[1]})"


def last_printed_line(result: dict[str, Any]) -> str:
    """The last line the command printed in a shell tool's `result`: the last of `ROW_TEXT`'s lines when it shows
    any (a CLI may wrap the output: Gemini CLI 0.61.0 ends it with `Process Group PGID: N` and
    `</untrusted_context>`), else its last non-empty line."""
    lines = [line.strip() for line in content_text(result.get("content")).splitlines() if line.strip()]
    rows = [line for line in lines if PRINTED_ROW.match(line)]
    return (rows or lines or ["(no output)"])[-1]


def latencies(model_s: float, summarizer_s: float) -> Callable[[dict[str, Any]], float]:
    """The fake's delay per request: the summarizer's for the proxy's summarizer calls, the model's for requests
    offering tools (the agent's loop), none for side requests."""

    def delay(body: dict[str, Any]) -> float:
        if is_summarizer_request(body):
            return summarizer_s
        return model_s if body.get("tools") else 0.0

    return delay


MARATHON_WINDOW = 32_768
MARATHON_TURNS = 100


def marathon_parser(doc: str | None, turns: int = MARATHON_TURNS) -> argparse.ArgumentParser:
    """The options of a driver that runs only the marathon: the window, the turns, `--keep`, the marathon's own
    and `--json`; the driver adds its client's."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0] if doc else None)
    parser.add_argument("--window", type=int, default=MARATHON_WINDOW, help="the model's context window")
    parser.add_argument("--turns", type=int, default=turns, help="tool-using turns before the fact question")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
    add_marathon_options(parser)
    add_json_option(parser)
    return parser


def marathon_main(args: argparse.Namespace, agent: Agent, parameters: dict[str, str]) -> None:
    """Run the marathon for `agent` and publish its report, with `parameters` (how the client was found)."""
    result = Report.start(agent.name, args)
    result.parameters.update(parameters)
    run_marathon(args, result, agent)
    result.publish(args.json)


def add_marathon_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--marathon", action="store_true", help="run the long tool-using session of issue 27")
    parser.add_argument(
        "--model-latency", type=float, default=DEFAULT_MODEL_LATENCY_S, help="seconds before each model answer"
    )
    parser.add_argument(
        "--summarizer-latency",
        type=float,
        default=DEFAULT_SUMMARIZER_LATENCY_S,
        help="seconds before each summarizer answer",
    )
    parser.add_argument(
        "--tool-output-tokens",
        type=int,
        default=DEFAULT_TOOL_OUTPUT_TOKENS,
        help="about how many tokens each turn's command prints",
    )
    parser.add_argument(
        "--restart-after",
        type=int,
        default=0,
        metavar="TURN",
        help="restart the proxy (a new process on the same port and store) after this turn; 0: never",
    )


def session_cost(proxy_url: str) -> dict[str, Any]:
    """The proxy's cost view of its largest session (the agent's; side requests may make small ones), and how
    many sessions it holds."""
    sessions = httpx.get(f"{proxy_url}/sessions", params={"limit": 100}, timeout=ADMIN_TIMEOUT_S).json()["data"]
    if not sessions:
        return {}
    largest = max(sessions, key=lambda session: session["message_count"])
    view = httpx.get(f"{proxy_url}/sessions/{largest['id']}", timeout=ADMIN_TIMEOUT_S).json()
    cost: dict[str, Any] = {**(view.get("cost") or {}), "sessions": len(sessions)}
    return cost


def model_entries(fake_url: str, window: int, names: Sequence[str]) -> list[dict[str, Any]]:
    """The agent's model names and the `summarizer`, all on the one fake, with the same window."""
    common = {"api_base": fake_url, "api_key": "k", "context_window": window}
    return [
        *({"name": name, "model": f"openai/{MAIN_MODEL_ID}", **common} for name in names),
        {"name": "summarizer", "model": f"openai/{SUMMARIZER_MODEL_ID}", **common},
    ]


ADDED_SUM = re.compile(r"^context_proxy_added_seconds_sum\{[^}]*\} (\S+)$", re.MULTILINE)
FIRST_BYTE_SUM = re.compile(r"^context_proxy_stream_first_byte_seconds_sum\{[^}]*\} (\S+)$", re.MULTILINE)
UPSTREAM_STREAM_SUM = re.compile(r'^context_proxy_upstream_seconds_sum\{[^}]*stream="true"[^}]*\} (\S+)$', re.MULTILINE)


def added_seconds(proxy_url: str) -> tuple[float, float]:
    """The proxy's own time so far: before its upstream calls (`context_proxy_added_seconds`, every model: what
    issue 27 saw growing with the session — storing the history, compaction, recall), and from a streamed
    request's arrival to its first byte less the upstream's opening of its stream (the door's reading and parsing
    of the body too, and the relay's first chunk)."""
    text = httpx.get(f"{proxy_url}/metrics", timeout=ADMIN_TIMEOUT_S).text
    added = sum(float(value) for value in ADDED_SUM.findall(text))
    first_byte = sum(float(value) for value in FIRST_BYTE_SUM.findall(text))
    return added, first_byte - sum(float(value) for value in UPSTREAM_STREAM_SUM.findall(text))


class ProcessProbe:
    """CPU seconds and resident memory of one process, read from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def cpu_s(self) -> float:
        """The CPU time of the process's threads, each read in nanoseconds from its `schedstat`: the process's
        `stat` counts 10 ms ticks, too coarse for a turn's ~25 ms (a turn read 0.02 or 0.03 s, and a ratio of
        10-turn means moved by a third from run to run). A thread that ended is not counted: the proxy's
        threads (event loop, database, worker pool) live as long as it does."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # it ended while being read
        return total / 1e9

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0


@dataclass
class MarathonTurn:
    number: int
    seconds: float
    exit_code: int
    error: bool
    main_requests: int
    summarizer_calls: int
    rejections: int
    sent_tokens: int
    cached_tokens: int
    cpu_s: float
    rss_mib: float
    answer: str


class TurnMeter:
    """What the fake and the proxy's process did between `start` and `stop`."""

    def __init__(self, fake: FakeUpstream, probe: ProcessProbe, proxy_url: str, windows: Sequence[int]) -> None:
        """`windows`: the last turns of the windows whose time before the upstream calls is wanted
        (`added_per_turn`); `/metrics` is read only at their edges, so the reads cost no measured turn's CPU."""
        self.fake = fake
        self.probe = probe
        self.proxy_url = proxy_url
        self._edges = frozenset(edge for end in windows for edge in (end - CPU_WINDOW, end))
        self._added: dict[int, tuple[float, float]] = {}
        """Turn number → `added_seconds` after it (0: before the first)."""
        self._marks = (0, 0, 0, 0.0, 0.0)

    def start(self) -> None:
        fake = self.fake
        if not self._added and 0 in self._edges:
            self._added[0] = added_seconds(self.proxy_url)
        self._marks = (len(fake.requests), len(fake.served), len(fake.rejected), self.probe.cpu_s(), time.monotonic())

    def stop(self, number: int, exit_code: int, error: bool, answer: str) -> MarathonTurn:
        requests, served, rejected, cpu, started = self._marks
        cpu_s = self.probe.cpu_s() - cpu
        if number in self._edges:
            self._added[number] = added_seconds(self.proxy_url)
        new = [request.body for request in self.fake.requests[requests:]]
        main = [s for s in self.fake.served[served:] if s.tools and s.model == MAIN_MODEL_ID]
        return MarathonTurn(
            number=number,
            seconds=time.monotonic() - started,
            exit_code=exit_code,
            error=error,
            main_requests=len(main),
            summarizer_calls=sum(1 for body in new if is_summarizer_request(body)),
            rejections=len(self.fake.rejected) - rejected,
            sent_tokens=sum(s.prompt_tokens for s in main),
            cached_tokens=sum(s.cached_tokens for s in main),
            cpu_s=cpu_s,
            rss_mib=self.probe.rss_mib(),
            answer=answer,
        )

    def added_per_turn(self, end: int, which: int = 0) -> float | None:
        """The proxy's mean time before the upstream calls (`which` 1: to its streams' first bytes, less the
        upstream's) over the `CPU_WINDOW` turns ending at `end`."""
        if end not in self._added or end - CPU_WINDOW not in self._added:
            return None
        return (self._added[end][which] - self._added[end - CPU_WINDOW][which]) / CPU_WINDOW


TurnRunner = Callable[[int, str], tuple[int, bool, str]]
"""Runs one turn's prompt through the CLI: (exit code, whether it reported an error, its answer)."""


@dataclass(frozen=True)
class Agent:
    """What the marathon needs of one CLI."""

    name: str
    model_names: Sequence[str]
    """The model names the CLI asks for, all configured on the proxy as the main model."""
    shell_tool: str
    arguments: Callable[[str, list[dict[str, Any]]], dict[str, Any]]
    """The shell tool's arguments for a command, given the tools a request offered."""
    start: Callable[[str, Path], TurnRunner]
    """Given the proxy's URL and a temporary folder (its own to set up): the turn runner."""
    max_output: int | None = None


def run_marathon(args: argparse.Namespace, result: Report, agent: Agent) -> None:
    """The whole marathon: the fake, the proxy in its own process, `args.turns` turns and the fact question, the
    report. The temporary folder is removed unless `args.keep`."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{agent.name}-marathon-"))
    try:
        with FakeUpstream(context_window=args.window) as fake:
            fake.responder = MarathonModel(agent.shell_tool, agent.arguments)
            fake.delay = latencies(args.model_latency, args.summarizer_latency)
            entries = model_entries(fake.url, args.window, agent.model_names)
            for entry in entries[:-1] if agent.max_output else ():
                entry["max_output"] = agent.max_output
            context = {"summarizer_model": "summarizer"}
            raw = make_config(tmp, fake.url, models=entries, upstream={"timeout_s": 120}, context=context)
            with ProxyProcess(raw, tmp, start_timeout_s=PROXY_START_TIMEOUT_S) as proxy:
                windows = (EARLY_TURN, args.turns)
                meter = TurnMeter(fake, ProcessProbe(proxy.pid), proxy.url, windows)
                run_turn = agent.start(proxy.url, tmp)
                turns: list[MarathonTurn] = []
                fact = None
                for number, prompt in enumerate(marathon_prompts(args.turns, args.tool_output_tokens), 1):
                    meter.start()
                    exit_code, error, answer = run_turn(number, prompt)
                    if prompt == FACT_QUESTION:
                        fact = answer
                        break
                    turn = meter.stop(number, exit_code, error, answer)
                    turns.append(turn)
                    if number == getattr(args, "restart_after", 0):
                        restart(proxy, meter, result, number)
                    print(
                        f"turn {number}: {turn.seconds:.1f} s, exit {exit_code}, summarizer {turn.summarizer_calls}, "
                        f"cached {turn.cached_tokens}/{turn.sent_tokens}, cpu {turn.cpu_s:.3f} s, "
                        f"rss {turn.rss_mib:.0f} MiB",
                        file=sys.stderr,
                    )
                added = [meter.added_per_turn(end) for end in windows]
                first_bytes = [meter.added_per_turn(end, 1) for end in windows]
                crossed = proxy_crossings(proxy.url, len(main_requests(fake)))
                cost = session_cost(proxy.url)
                marathon_report(result, turns, fact, fake, cost, added, first_bytes, crossed)
                client_compaction_notes(result, fake, proxy.url, len(turns))
                prompt_break_notes(result, fake, crossed)
                if args.keep:
                    dump_requests(fake, tmp / "upstream.jsonl")
    finally:
        if args.keep:
            result.notes.append(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def restart(proxy: ProxyProcess, meter: TurnMeter, report: Report, number: int) -> None:
    """A new proxy process in place of the running one, on the same port and store: what it kept in memory is gone
    (`proxy.history.warming`). Its `/metrics` start from zero, so the counts read from them at the end (the client
    compactions answered, the time before the upstream calls across the restart) are those after it."""
    proxy.stop()
    proxy.start()
    meter.probe = ProcessProbe(proxy.pid)
    report.notes.append(f"the proxy was restarted after turn {number}: /metrics counts are those after it")


CLIENT_COMPACTIONS = re.compile(
    r'^context_proxy_client_compactions_total\{[^}]*kind="(\w+)"[^}]*\} (\S+)$', re.MULTILINE
)


def client_compaction_notes(report: Report, fake: FakeUpstream, proxy_url: str, turns: int) -> None:
    """The client's own compaction (issue 44): its summary requests that reached the upstream (recognized as the
    proxy recognizes them, `proxy.compaction.client_prompts`), those the proxy answered itself, and how many
    sessions the run made (one, when the client's compactions kept it one path)."""
    reached = sum(
        1 for request in fake.requests if recognize(request.body.get("messages") or [], bool(request.body.get("tools")))
    )
    text = httpx.get(f"{proxy_url}/metrics", timeout=ADMIN_TIMEOUT_S).text
    answered = {kind: float(value) for kind, value in CLIENT_COMPACTIONS.findall(text)}
    sessions = httpx.get(f"{proxy_url}/sessions", params={"limit": 100}, timeout=ADMIN_TIMEOUT_S).json()["data"]
    report.ratios["client summary calls reaching the upstream per 10 turns"] = round(10 * reached / max(turns, 1), 2)
    report.ratios["sessions"] = len(sessions)
    report.notes.append(
        f"client compactions answered by the proxy: {answered or 'none'}; client summary calls that reached the "
        f"upstream: {reached}; sessions: {len(sessions)} ("
        + ", ".join(f"{s['message_count']} messages" for s in sessions[:5])
        + ")"
    )


def main_requests(fake: FakeUpstream) -> list[dict[str, Any]]:
    """The bodies of the main model's requests offering tools (the agent's loop), in the order received."""
    return [
        request.body
        for request in fake.requests
        if request.body.get("tools")
        and request.body.get("model") == MAIN_MODEL_ID
        and not is_summarizer_request(request.body)
    ]


JOURNAL_PAGE = 500


def proxy_crossings(proxy_url: str, requests: int) -> list[bool] | None:
    """For each main-model request, in order: did the proxy cross the budget at it (its journal step's `crossed`:
    it wrote spans, masks included, or joined those written ahead)? The steps offering tools are the agent's loop,
    as `main_requests` are; None when the journal does not say (an older proxy) or its count differs (a retry)."""
    steps: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = httpx.get(
            f"{proxy_url}/journal", params={"limit": JOURNAL_PAGE, "offset": offset}, timeout=ADMIN_TIMEOUT_S
        ).json()
        steps += page["data"]
        offset += JOURNAL_PAGE
        if not page.get("has_more"):
            break
    contexts = [step.get("context") or {} for step in sorted(steps, key=lambda step: step["step_id"])]
    main = [context for context in contexts if context.get("definitions")]
    if len(main) != requests or any("crossed" not in context for context in main):
        return None
    return [bool(context["crossed"]) for context in main]


def prompt_breaks(bodies: Sequence[dict[str, Any]], crossed: Sequence[bool] | None = None) -> dict[str, list[int]]:
    """The main-model requests (their index in `bodies`) whose messages do not begin with the previous request's
    (the cached prefix broke), by kind: `crossing` where the proxy crossed the budget at that request (`crossed`,
    from its journal) or, without that, where the prompt is shorter than the one before; `recall` where the first
    message that differs is a recall the proxy placed before the previous question (the next turn's question no
    longer asks for it); `other` for the rest."""
    kinds: dict[str, list[int]] = {"crossing": [], "recall": [], "other": []}
    previous: tuple[list[str], list[str], list[dict[str, Any]], int] | None = None
    for index, body in enumerate(bodies):
        tools = [json.dumps(tool, sort_keys=True) for tool in body.get("tools") or []]
        messages = [json.dumps(message, sort_keys=True) for message in body.get("messages") or []]
        size = len(prompt_token_ids(body))
        if previous is not None:
            before_tools, before, raw, before_size = previous
            if tools != before_tools or messages[: len(before)] != before:
                differs = next((at for at, (x, y) in enumerate(zip(before, messages, strict=False)) if x != y), None)
                text = content_text(raw[differs].get("content")) if differs is not None else ""
                if crossed is not None and crossed[index]:
                    kind = "crossing"
                elif text.startswith(RECALL_HEADER):
                    kind = "recall"
                else:
                    kind = "crossing" if crossed is None and size < before_size else "other"
                kinds[kind].append(index)
        previous = (tools, messages, body.get("messages") or [], size)
    return kinds


def prompt_break_notes(report: Report, fake: FakeUpstream, crossed: Sequence[bool] | None = None) -> None:
    """Issue 44's "no break of the cached prefix between two crossings", from what the upstream received and,
    where the proxy's journal says, at which requests it crossed."""
    kinds = prompt_breaks(main_requests(fake), crossed)
    report.ratios["prompt breaks between crossings (recall drops)"] = len(kinds["recall"])
    report.ratios["prompt breaks between crossings (other)"] = len(kinds["other"])
    source = "the proxy's journal" if crossed is not None else "a shorter prompt (no journal)"
    report.notes.append(
        f"prompt breaks (a main-model request not extending the previous one; crossings from {source}): "
        + "; ".join(f"{kind} {len(found)} at requests {found[:24]}" for kind, found in kinds.items())
    )


def dump_requests(fake: FakeUpstream, path: Path) -> None:
    """Every request body the fake received, one JSON a line (kept with `--keep`, to compare requests)."""
    with path.open("w") as out:
        for request in fake.requests:
            out.write(json.dumps(request.body) + "\n")


def cached_share(served: Sequence[Served]) -> float:
    main = [s for s in served if s.tools and s.model == MAIN_MODEL_ID]
    sent = sum(s.prompt_tokens for s in main)
    return sum(s.cached_tokens for s in main) / sent if sent else 0.0


CACHE_SLACK = 512
"""Tokens a request's cached prefix may fall short of the previous prompt without counting as a break: the end of
a prompt (the last message's closing, the reply priming) is not in the next one, and the fake caches in blocks."""


def prefix_breaks(served: Sequence[Served], crossed: Sequence[bool] | None = None) -> tuple[int, int]:
    """How many main-model requests were not served their previous prompt from the cache, and how many of those
    came between two crossings (issue 44: none should): a break at a request the proxy did not cross at
    (`crossed`, from its journal; without it, one where the prompt did not shrink) is one no compaction
    explains."""
    main = [s for s in served if s.tools and s.model == MAIN_MODEL_ID]
    breaks = [
        index
        for index, (before, after) in enumerate(pairwise(main), 1)
        if after.cached_tokens + CACHE_SLACK < before.prompt_tokens
    ]
    if crossed is not None and len(crossed) == len(main):
        return len(breaks), sum(1 for index in breaks if not crossed[index])
    return len(breaks), sum(1 for index in breaks if main[index].prompt_tokens >= main[index - 1].prompt_tokens)


def marathon_report(
    report: Report,
    turns: list[MarathonTurn],
    fact: str | None,
    fake: FakeUpstream,
    proxy_cost: dict[str, Any],
    added: Sequence[float | None] = (None, None),
    first_bytes: Sequence[float | None] = (None, None),
    crossed: Sequence[bool] | None = None,
) -> None:
    """The per-turn table of the work turns, and the headline figures; `fact`: the answer to the fact question;
    `added`: the proxy's mean time before the upstream calls per turn, to `EARLY_TURN` and to the last turn;
    `first_bytes`: likewise to a stream's first byte less the upstream's; `crossed`: the main-model requests the
    proxy crossed the budget at (`proxy_crossings`)."""
    table = report.table(
        "marathon",
        "per turn: wall time, requests, summarizer calls, rejections, main-model tokens, the proxy's CPU and RSS",
        columns(
            ("number", "turn"), ("seconds", "s", ".2f"), ("exit_code", "exit"), ("error",),
            ("main_requests", "main"), ("summarizer_calls", "summ"), ("rejections", "rej"), ("sent_tokens", "sent"),
            ("cached_pct", "cached%", ".1f"), ("cpu_s", "cpu s", ".3f"), ("rss_mib", "rss MiB", ".1f"), ("answer",),
        ),
    )  # fmt: skip
    for turn in turns:
        cached = 100 * turn.cached_tokens / turn.sent_tokens if turn.sent_tokens else 0.0
        table.add(**{**turn.__dict__, "cached_pct": cached, "answer": turn.answer[:48]})
    if not turns:
        return
    median = statistics.median(turn.seconds for turn in turns)
    slow = [turn.number for turn in turns if turn.seconds > median + SLOW_TURN_S]
    summarizer = sum(1 for request in fake.requests if is_summarizer_request(request.body))
    failed = [turn.number for turn in turns if turn.exit_code != 0 or turn.error]
    early = next((turn for turn in turns if turn.number == EARLY_TURN), turns[0])
    last = turns[-1]
    fact = "(not asked)" if fact is None else fact
    ratios = report.ratios
    ratios["cached share of the main model's input"] = round(cached_share(fake.served), 4)
    ratios["summarizer calls per 10 turns"] = round(10 * summarizer / len(turns), 2)
    breaks, unexplained = prefix_breaks(fake.served, crossed)
    ratios["prompt cache breaks"] = breaks
    ratios["prompt cache breaks between two crossings"] = unexplained
    if crossed is not None:
        ratios["crossings (the proxy's journal)"] = sum(crossed)
    early_cpu = statistics.mean(t.cpu_s for t in turns if early.number - CPU_WINDOW < t.number <= early.number)
    last_cpu = statistics.mean(t.cpu_s for t in turns[-CPU_WINDOW:])
    ratios[f"proxy CPU s per turn, last {CPU_WINDOW} turns / {CPU_WINDOW} turns to turn {early.number}"] = round(
        last_cpu / max(early_cpu, 0.001), 2
    )
    early_added, last_added = added
    if early_added and last_added is not None:
        name = f"proxy time before the upstream calls per turn, last {CPU_WINDOW} / {CPU_WINDOW} to turn {EARLY_TURN}"
        ratios[name] = round(last_added / early_added, 2)
    early_first, last_first = first_bytes
    if early_first and last_first is not None:
        name = f"proxy time to a stream's first byte per turn, last {CPU_WINDOW} / {CPU_WINDOW} to turn {EARLY_TURN}"
        ratios[name] = round(last_first / early_first, 2)
    ratios[f"proxy RSS, turn {last.number} / turn {early.number}"] = round(last.rss_mib / early.rss_mib, 2)
    report.notes.extend(
        [
            f"turns: {len(turns)} (+ the fact question); failed: {failed or 'none'}; upstream rejections: "
            f"{len(fake.rejected)}",
            f"median turn {median:.2f} s; slower than median + {SLOW_TURN_S} s: {len(slow)} turns {slow[:20]}",
            f"summarizer calls: {summarizer}",
            f"proxy CPU per turn (mean of {CPU_WINDOW}): to turn {early.number} {early_cpu:.3f} s, to turn "
            f"{last.number} {last_cpu:.3f} s; "
            f"RSS: {early.rss_mib:.1f} MiB → {last.rss_mib:.1f} MiB",
            f"proxy time before the upstream calls per turn (mean of {CPU_WINDOW}, context_proxy_added_seconds): "
            + ", ".join(
                f"to turn {end} " + ("-" if value is None else f"{1000 * value:.1f} ms")
                for end, value in zip((EARLY_TURN, last.number), added, strict=True)
            ),
            f"proxy time to a stream's first byte less the upstream's per turn (mean of {CPU_WINDOW}, "
            "context_proxy_stream_first_byte_seconds - context_proxy_upstream_seconds{stream=true}): "
            + ", ".join(
                f"to turn {end} " + ("-" if value is None else f"{1000 * value:.1f} ms")
                for end, value in zip((EARLY_TURN, last.number), first_bytes, strict=True)
            ),
            f"fact question ({FACT_KEY}): answered {fact!r}, expected {FACT_VALUE!r}: "
            + ("RIGHT" if FACT_VALUE in fact else "WRONG"),
            "the proxy's own cost view (GET /sessions/{id} cost): "
            + ", ".join(f"{key}={proxy_cost.get(key)}" for key in COST_KEYS),
        ]
    )  # fmt: skip
