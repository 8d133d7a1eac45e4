"""What the stream journal costs at the storage layer: chunks/s relayed with it and without it.

A stream of N small chunks goes through `Journal.begin` → `append` per batch → `seal`, and each batch is then
encoded as SSE bytes (what the relay does after the commit); "journal off" is the SSE encoding alone. A batch
is the group of chunks that arrived while the previous commit was in flight: 1 is a slow upstream (one commit
per chunk, the worst case), larger batches a fast one. `synchronous` is SQLite's: NORMAL commits to the WAL
without fsync (durable against a process kill, not a power cut), FULL fsyncs every commit.

Size (`--size [--chunks N] [--chunk-chars C]`): N chunks of C characters each journaled as one stream and sealed,
then the pages each table takes (SQLite's dbstat) against the text's size: what a long answer costs on disk.

Run by hand: `.venv/bin/python bench/journal.py [--chunks N] [--dir DIR]`. The served end-to-end relay
benchmark imports `journal_cost` and `relay_cost` from here.

End to end (`--e2e [--rounds R] [--words W]`): a fake upstream streams a W-word reply (one chunk per word, no
delay) and the client reads it through each target, in separate processes, alternating the order every round:

    direct        the fake upstream itself (reference: what a client gets without any proxy)
    off           context-proxy with a journal whose begin/append/seal/fail/interrupt do nothing
    NORMAL, FULL  context-proxy with the journal on, `journal.synchronous` NORMAL or FULL

It prints median chunks/s, MB/s and time to the first chunk, with ratios to `off` (target: NORMAL ≥ 90 %).
`--profile FILE` writes a pyinstrument profile of the NORMAL proxy (HTML) for the same run. Both sections take
`--json PATH` (bench/harness/report.py's format).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import httpx

# Run as a script from a checkout that is not installed: make the repository's `proxy` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import servers
from bench.harness.clients import StreamRead, round_order, stream_once
from bench.harness.processes import process, python
from bench.harness.report import Report, add_json_option, columns
from proxy.config.schema import JournalConfig
from proxy.history.answers import Answers
from proxy.history.store import History
from proxy.journal.writer import Journal
from proxy.store.database import Database

Chunk = dict[str, Any]

DEFAULT_CHUNKS = 2_000
BATCHES = (1, 8, 64)
MODES = ("NORMAL", "FULL")
TENANT = "bench"
MODEL = "gpt-4"


def small_chunks(count: int) -> list[Chunk]:
    """OpenAI-shaped chunks of a token or two each, ending with a finish_reason."""
    chunks: list[Chunk] = [
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": f" word{n}"}, "finish_reason": None}],
        }
        for n in range(count)
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    return chunks


def _sse(batch: list[Chunk]) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in batch)


def _batches(chunks: list[Chunk], batch: int) -> list[list[Chunk]]:
    return [chunks[start : start + batch] for start in range(0, len(chunks), batch)]


async def relay_cost(chunks: list[Chunk], batch: int) -> float:
    """Chunks/s with the journal off: the SSE encoding the relay does anyway."""
    groups = _batches(chunks, batch)
    started = time.perf_counter()
    for group in groups:
        _sse(group)
        await asyncio.sleep(0)  # the relay hands each group to the response task
    return len(chunks) / (time.perf_counter() - started)


async def journal_stream(journal: Journal, groups: list[list[Chunk]], encode: bool = False) -> None:
    """One streamed step: begin, append each group (and encode it as SSE, as the relay does), seal."""
    step = await journal.begin(
        tenant=TENANT,
        session_id=None,
        model=MODEL,
        fingerprint="bench",
        idempotency_key=None,
        stream=True,
        parent_message_id=None,
        encoding="cl100k_base",
    )
    for group in groups:
        await journal.append(step, group)
        if encode:
            _sse(group)
    await journal.seal(step)


async def journal_cost(db_path: Path, synchronous: str, chunks: list[Chunk], batch: int) -> float:
    """Chunks/s through begin → append per batch → seal → SSE encoding, on a fresh store at `db_path`."""
    db = await Database.open(db_path, synchronous)
    try:
        journal = Journal(db, Answers(History(db)), JournalConfig(synchronous=synchronous))
        groups = _batches(chunks, batch)
        started = time.perf_counter()
        await journal_stream(journal, groups, encode=True)
        return len(chunks) / (time.perf_counter() - started)
    finally:
        await db.close()


async def storage_section(chunk_count: int, folder_root: Path | None, result: Report) -> None:
    chunks = small_chunks(chunk_count)
    table = result.table(
        "storage",
        f"{chunk_count} chunks; chunks/s (ratio to journal off)",
        columns(
            ("batch",), ("off", "journal off", ",.0f"),
            *((mode, mode, ",.0f") for mode in MODES), *((f"{mode}_ratio", f"{mode}/off", ".1%") for mode in MODES),
        ),
    )  # fmt: skip
    with tempfile.TemporaryDirectory(dir=folder_root) as folder:
        for batch in BATCHES:
            off = max([await relay_cost(chunks, batch) for _ in range(3)])
            row: dict[str, Any] = {"batch": batch, "off": off}
            for mode in MODES:
                row[mode] = await journal_cost(Path(folder) / f"{mode}-{batch}.sqlite", mode, chunks, batch)
                row[f"{mode}_ratio"] = row[mode] / off
            table.add(**row)


def sized_chunks(count: int, chars: int) -> list[Chunk]:
    chunks = small_chunks(count)
    for n, chunk in enumerate(chunks):
        chunk["choices"][0]["delta"]["content"] = f"{n:08d}" + "x" * (chars - 8)
    return chunks


async def size_section(chunk_count: int, chars: int, folder_root: Path | None, result: Report) -> None:
    table = result.table(
        "size",
        f"{chunk_count} chunks of {chars} characters ({chunk_count * chars / 1e6:.1f} MB of text), sealed",
        columns(("table",), ("bytes", "bytes on disk", ",.0f"), ("ratio", "per text byte", ".2f")),
    )
    with tempfile.TemporaryDirectory(dir=folder_root) as folder:
        path = Path(folder) / "size.sqlite"
        db = await Database.open(path, "NORMAL")
        try:
            journal = Journal(db, Answers(History(db)), JournalConfig(synchronous="NORMAL"))
            chunks = sized_chunks(chunk_count, chars)
            await journal_stream(journal, _batches(chunks, 8))
        finally:
            await db.close()
        text = chunk_count * chars
        with closing(sqlite3.connect(path)) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            query = "SELECT tbl_name, SUM(pgsize) FROM dbstat JOIN sqlite_master USING (name) GROUP BY tbl_name"
            sizes = dict(connection.execute(query).fetchall())
        for name in ("journal_events", "journal_steps"):
            table.add(table=name, bytes=sizes.get(name, 0), ratio=sizes.get(name, 0) / text)
        table.add(table="whole file", bytes=path.stat().st_size, ratio=path.stat().st_size / text)


# --- end to end: served proxies, a fake upstream, all in their own processes ---------------------------------

E2E_WORDS = 2_000
E2E_ROUNDS = 7
E2E_WARMUP = 2
TARGETS = ("direct", "off", "NORMAL", "FULL")
PROXIES = {"off": "NORMAL", "NORMAL": "NORMAL", "FULL": "FULL"}
"""Proxy target → its `journal.synchronous` (the `off` proxy's journal writes nothing, so it does not matter)."""


def disable_journal() -> None:
    """Make `proxy.journal.writer.Journal` write nothing: begin hands out an in-memory step, the rest are no-ops.

    `append` still returns the chunks' JSON when the real one does (the relay sends those bytes), so `off`
    differs from `on` by the storage alone, not by the encoding the relay needs anyway.
    """
    import inspect

    from proxy.journal import steps, writer

    returns_texts = inspect.signature(writer.Journal.append).return_annotation not in (None, "None")
    encoder = json.JSONEncoder(separators=(",", ":"))

    async def begin(self: writer.Journal, **fields: Any) -> steps.Step:
        keep = ("tenant", "session_id", "model", "stream", "parent_message_id")
        return steps.Step(0, **{name: fields[name] for name in keep}, encoding=fields["encoding"])

    async def append(self: writer.Journal, step: steps.Step, chunks: list[Chunk]) -> list[str] | None:
        return [encoder.encode(chunk) for chunk in chunks] if returns_texts else None

    async def seal(self: writer.Journal, step: steps.Step, response: Chunk | None = None) -> steps.StepRecord:
        empty = dict.fromkeys(("sealed_at", "content", "tool_calls", "finish_reason", "usage", "error", "message_id"))
        return steps.StepRecord(
            id=step.id,
            tenant=step.tenant,
            session_id=step.session_id,
            model=step.model,
            stream=step.stream,
            status=steps.StepStatus.SEALED,
            created_at=step.created_at,
            events=0,
            **empty,
        )

    async def end(self: writer.Journal, step: steps.Step, *args: Any) -> None:
        return None

    for name, method in {"begin": begin, "append": append, "seal": seal, "fail": end, "interrupt": end}.items():
        setattr(writer.Journal, name, method)


def serve_proxy(config_path: str, port: int, journal_on: bool, profile: Path | None) -> None:
    """`context-proxy serve`, with the journal on or off, optionally under pyinstrument."""
    from proxy import environment

    environment.prepare()
    import uvicorn

    from proxy.config.schema import load_config
    from proxy.serving.app import create_app

    if not journal_on:
        disable_journal()
    app = create_app(load_config(config_path))
    if profile is None:
        uvicorn.run(app, host=servers.HOST, port=port, log_level="warning", lifespan="on")
        return
    import signal

    from pyinstrument import Profiler

    profiler = Profiler(async_mode="enabled")
    server = uvicorn.Server(uvicorn.Config(app, host=servers.HOST, port=port, log_level="warning", lifespan="on"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    profiler.start()
    try:
        server.run()
    finally:
        profiler.stop()
        profile.write_text(profiler.output_html())
        profile.with_suffix(".txt").write_text(profiler.output_text(unicode=True, color=False))


def e2e_run(rounds: int, reply_words: int, workdir: Path, profile: Path | None) -> dict[str, list[StreamRead]]:
    fake_port = servers.free_port()
    upstream = f"{servers.base_url(fake_port)}/v1"
    ports = {target: servers.free_port() for target in PROXIES}
    urls = {"direct": f"{upstream}/chat/completions"}
    this = str(Path(__file__).resolve())
    body = {"model": "fake", "messages": [{"role": "user", "content": "Count."}], "stream": True}
    samples: dict[str, list[StreamRead]] = {target: [] for target in TARGETS}
    with ExitStack() as stack:
        stack.enter_context(servers.fake_upstream(fake_port, reply_words=reply_words, log=workdir / "fake.log"))
        for target, synchronous in PROXIES.items():
            config_path = servers.proxy_config(workdir, upstream, target, journal={"synchronous": synchronous})
            journal = "off" if target == "off" else "on"
            args = python(this, "--serve-proxy", str(config_path), str(ports[target]), "--journal", journal)
            if profile is not None and target == "NORMAL":
                args += ["--profile", str(profile)]
            url = servers.base_url(ports[target])
            stack.enter_context(process(args, f"{url}/healthz", log=workdir / f"{target}.log"))
            urls[target] = url + servers.CHAT_PATH
        client = stack.enter_context(httpx.Client(timeout=120))
        for target in TARGETS:  # warm-up: lazy imports, the session's first write, connection pools
            for _ in range(E2E_WARMUP):
                stream_once(client, urls[target], body)
        for round_index in range(rounds):
            for target in round_order(TARGETS, round_index):
                samples[target].append(stream_once(client, urls[target], body))
    return samples


def e2e_table(samples: dict[str, list[StreamRead]], words: int, result: Report) -> None:
    table = result.table(
        "e2e",
        f"{words}-word reply streamed through each target",
        columns(
            ("target",), ("chunks", "chunks", ".0f"), ("total_ms", "total ms", ".1f"), ("rate", "chunks/s", ",.0f"),
            ("mbps", "MB/s", ".2f"), ("vs_off", "vs off", ".1%"), ("ttfc_ms", "TTFC ms", ".2f"),
            ("ttfc_over_off_ms", "TTFC − off", "+.2f"),
        ),
    )  # fmt: skip
    for target, runs in samples.items():
        table.add(
            target=target,
            chunks=statistics.median(run.chunks for run in runs),
            total_ms=statistics.median(run.total_s for run in runs) * 1000,
            rate=statistics.median(run.chunks / run.total_s for run in runs),
            mbps=statistics.median(run.bytes / run.total_s for run in runs) / 1e6,
            ttfc_ms=statistics.median(run.first_s for run in runs) * 1000,
        )
    off = next(row for row in table.rows if row["target"] == "off")
    for row in table.rows:
        row["vs_off"] = row["rate"] / off["rate"]
        row["ttfc_over_off_ms"] = row["ttfc_ms"] - off["ttfc_ms"]
        if row["target"] != "off":
            result.ratios[f"{row['target']} chunks/s / off's"] = row["vs_off"]
    rounds = len(next(iter(samples.values())))
    table.notes.append(
        f"medians of {rounds} alternating rounds; 'vs off' = chunks/s ÷ the journal-off proxy's; "
        "MB/s counts the SSE bytes the client received"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS)
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go (default: a temp dir)")
    parser.add_argument("--e2e", action="store_true", help="the served end-to-end benchmark instead")
    parser.add_argument("--size", action="store_true", help="bytes on disk per byte of text instead")
    parser.add_argument("--chunk-chars", type=int, default=1024, help="characters per chunk (--size)")
    parser.add_argument("--rounds", type=int, default=E2E_ROUNDS)
    parser.add_argument("--words", type=int, default=E2E_WORDS, help="words (chunks) in the streamed reply")
    parser.add_argument(
        "--profile", type=Path, help="profile the NORMAL proxy with pyinstrument into this HTML (and a .txt beside it)"
    )
    add_json_option(parser)
    parser.add_argument("--serve-proxy", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--journal", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_proxy:
        serve_proxy(args.serve_proxy[0], int(args.serve_proxy[1]), args.journal == "on", args.profile)
        return
    result = Report.start("journal-e2e" if args.e2e else "journal-size" if args.size else "journal", args)
    del result.parameters["serve_proxy"], result.parameters["journal"]
    if args.e2e:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-journal-") as folder:
            samples = e2e_run(args.rounds, args.words, Path(folder), args.profile)
        e2e_table(samples, args.words, result)
    elif args.size:
        asyncio.run(size_section(args.chunks, args.chunk_chars, args.dir, result))
    else:
        asyncio.run(storage_section(args.chunks, args.dir, result))
    result.publish(args.json)


if __name__ == "__main__":
    main()
