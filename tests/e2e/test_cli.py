"""`context-proxy`: config errors as one line, the loopback guard of `serve`, reading the store from the shell,
`migrate` (export and import: `tests/e2e/test_transfer.py`), and a store path it cannot use as one line."""

from __future__ import annotations

import json
import logging.config
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import uvicorn
from openai.types.chat import ChatCompletionMessageParam

from proxy.cli.commands import EXIT_CONFIG, EXIT_STORE, main
from proxy.observability.logs import TEXT_FORMAT
from proxy.serving.server import DeadlineProtocol
from proxy.serving.sockets import SocketProtocol
from proxy.store.migrations import MIGRATIONS
from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream
from tests.support.postgres_server import PostgresServer
from tests.support.proxy_server import free_port, make_config
from tests.support.raw_store import committed_rows

REPO_ROOT = Path(__file__).resolve().parents[2]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "what is a tide?"},
]


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(json.dumps(raw))
    return path


class UvicornCalls:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, app: Any, **kwargs: Any) -> None:
        self.calls.append(kwargs)


@pytest.fixture
def uvicorn_run(monkeypatch: pytest.MonkeyPatch) -> UvicornCalls:
    """`serve` must never really start a server in these tests: uvicorn.run only records its arguments."""
    calls = UvicornCalls()
    monkeypatch.setattr(uvicorn, "run", calls)
    # Nor configure this process's logging: the config serve builds is checked in what uvicorn.run was given.
    monkeypatch.setattr(logging.config, "dictConfig", lambda config: None)
    return calls


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"server": {"port": "eighty"}}, "server.port"),
        ({"sever": {}}, "sever"),
        ({"models": [{"model": "openai/x"}]}, "models[0].name"),
        ({"context": {"summarizer_model": "ghost"}}, "context.summarizer_model"),
    ],
)
@pytest.mark.parametrize("command", [["serve"], ["sessions", "list"], ["journal", "list"]])
def test_bad_config_is_one_line_naming_the_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    uvicorn_run: UvicornCalls,
    raw: dict[str, Any],
    key: str,
    command: list[str],
) -> None:
    config = write_config(tmp_path / "bad.json", raw)

    assert main([*command, "--config", str(config)]) == EXIT_CONFIG == 2

    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"context-proxy: config error: {key}: ") or err.startswith(
        f"context-proxy: config error: {key} "
    ), err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert uvicorn_run.calls == []


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "list", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "config error: cannot read config file" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().out


def test_serve_refuses_an_open_proxy_beyond_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], uvicorn_run: UvicornCalls
) -> None:
    config = write_config(tmp_path / "open.json", {"server": {"host": "0.0.0.0", "port": 9999}})

    assert main(["serve", "--config", str(config)]) == 2

    err = capsys.readouterr().err
    assert "refusing to serve without auth.keys on 0.0.0.0" in err
    assert "--host 0.0.0.0" in err
    assert uvicorn_run.calls == []


def test_serve_binds_beyond_loopback_when_asked_explicitly_or_with_keys(
    tmp_path: Path, uvicorn_run: UvicornCalls
) -> None:
    open_config = write_config(tmp_path / "open.json", {"server": {"host": "0.0.0.0", "port": 9999}})
    keyed_config = write_config(
        tmp_path / "keyed.json", {"server": {"host": "0.0.0.0", "port": 9998}, "auth": {"keys": ["k1"]}}
    )

    assert main(["serve", "--config", str(open_config), "--host", "0.0.0.0", "--port", "9100"]) == 0
    assert main(["serve", "--config", str(keyed_config), "--log-level", "warning"]) == 0
    assert main(["serve", "--config", str(write_config(tmp_path / "local.json", {}))]) == 0

    assert [(c["host"], c["port"]) for c in uvicorn_run.calls] == [
        ("0.0.0.0", 9100),
        ("0.0.0.0", 9998),
        ("127.0.0.1", 8787),
    ]
    assert uvicorn_run.calls[1]["log_level"] == "warning"
    assert uvicorn_run.calls[1]["log_config"]["root"]["level"] == "WARNING"
    assert uvicorn_run.calls[2]["log_config"]["formatters"]["proxy"] == {"format": TEXT_FORMAT}
    assert uvicorn_run.calls[2]["timeout_keep_alive"] == 75.0
    assert issubclass(uvicorn_run.calls[2]["http"], DeadlineProtocol)
    assert issubclass(uvicorn_run.calls[2]["ws"], SocketProtocol)


def test_serve_logs_json_at_the_configured_level_unless_the_flag_says_otherwise(
    tmp_path: Path, uvicorn_run: UvicornCalls
) -> None:
    config = write_config(tmp_path / "json.json", {"logging": {"format": "json", "level": "debug"}})

    assert main(["serve", "--config", str(config)]) == 0
    assert main(["serve", "--config", str(config), "--log-level", "error"]) == 0

    first, second = uvicorn_run.calls
    assert first["log_level"] == "debug"
    assert first["log_config"]["formatters"]["proxy"] == {"()": "proxy.observability.logs.JsonFormatter"}
    assert first["log_config"]["root"]["level"] == "DEBUG"
    assert second["log_config"]["root"]["level"] == second["log_config"]["loggers"]["uvicorn.access"]["level"]
    assert second["log_config"]["root"]["level"] == "ERROR"


def test_sessions_and_journal_read_the_servers_store(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = serve_proxy()
    messages = cast("list[ChatCompletionMessageParam]", MESSAGES)
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model="fake", messages=messages)
    session_id = raw.headers["x-session-id"]
    answer = raw.parse().choices[0].message.content
    assert answer == "echo: what is a tide?"
    config = write_config(tmp_path / "proxy.json", make_config(tmp_path, fake.url))

    assert main(["sessions", "list", "--config", str(config), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [s["id"] for s in listing["data"]] == [session_id]
    assert listing["data"][0]["model"] == "fake"
    assert listing["data"][0]["message_count"] == 3

    assert main(["sessions", "show", session_id, "--config", str(config), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == session_id
    assert [(m["role"], m["content"]) for m in shown["messages"]] == [
        ("system", "You are terse."),
        ("user", "what is a tide?"),
        ("assistant", answer),
    ]

    assert main(["journal", "list", "--config", str(config), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)
    assert len(steps["data"]) == 1
    assert steps["data"][0]["session_id"] == session_id
    assert steps["data"][0]["status"] == "sealed"

    assert main(["sessions", "list", "--config", str(config)]) == 0
    assert session_id in capsys.readouterr().out


def test_showing_an_unknown_session_fails_cleanly(
    tmp_path: Path, fake: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "proxy.json", make_config(tmp_path, fake.url))
    assert main(["sessions", "show", "no-such-session", "--config", str(config)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "no-such-session" in err
    assert "Traceback" not in err


def test_python_m_proxy_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "context-proxy" in result.stdout
    for command in ("serve", "sessions", "journal", "migrate", "export", "import"):
        assert command in result.stdout


def test_sessions_pin_unpin_pins_and_events(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = serve_proxy()
    messages = cast("list[ChatCompletionMessageParam]", MESSAGES)
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0) as client:
        session_id = client.chat.completions.with_raw_response.create(model="fake", messages=messages).headers[
            "x-session-id"
        ]
    config = str(write_config(tmp_path / "proxy.json", make_config(tmp_path, fake.url)))
    assert main(["sessions", "show", session_id, "--config", config, "--json"]) == 0
    ids = [m["id"] for m in json.loads(capsys.readouterr().out)["messages"]]
    assert main(["sessions", "show", session_id, "--config", config]) == 0
    assert ids[1][:12] in capsys.readouterr().out  # the text view shows the prefix `pin` takes

    assert main(["sessions", "pin", session_id, ids[1][:12], ids[2], "--config", config, "--json"]) == 0
    pinned = json.loads(capsys.readouterr().out)
    assert [(p["message_id"], p["pinned_by"]) for p in pinned["pins"]] == [(ids[1], "api"), (ids[2], "api")]
    assert main(["sessions", "pins", session_id, "--config", config]) == 0
    listing = capsys.readouterr().out
    assert f"session {session_id}  2 pinned" in listing
    assert ids[1] in listing
    assert ids[2] in listing
    shown = httpx.get(f"{proxy.url}/sessions/{session_id}", timeout=10).json()  # the server sees the CLI's pins
    assert [m["pinned"] for m in shown["messages"]] == [False, True, True]

    assert main(["sessions", "unpin", session_id, ids[2], "--config", config, "--json"]) == 0
    unpinned = json.loads(capsys.readouterr().out)
    assert (unpinned["removed"], [p["message_id"] for p in unpinned["pins"]]) == (1, [ids[1]])

    assert main(["sessions", "pin", session_id, "no-such-message", "--config", config]) == 1
    out, err = capsys.readouterr()
    assert (out, err.count("\n")) == ("", 1)
    assert "'no-such-message'" in err
    assert "Traceback" not in err
    assert main(["sessions", "pins", "no-such-session", "--config", config]) == 1
    assert "no-such-session" in capsys.readouterr().err

    with sqlite3.connect(proxy.config.store.path) as db:
        db.execute(
            "INSERT INTO compaction_events (tenant, session_id, event, strategy, range_start, range_end, "
            "tokens_before, tokens_after, duration_ms, summary_id, generated_by, model, created_at) "
            "VALUES ('open', ?, 'complete', 'llm', 1, 3, 900, 120, 812.0, 4, 'llm', 'fake', 1000.0)",
            (session_id,),
        )
    assert main(["sessions", "events", session_id, "--config", config, "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [(e["event"], e["tokens_before"], e["tokens_after"]) for e in events["events"]] == [("complete", 900, 120)]
    assert events["more"] is False
    assert main(["sessions", "events", session_id, "--config", config]) == 0
    text = capsys.readouterr().out
    assert "complete" in text
    assert "900 -> 120" in text
    assert "[1, 3)" in text


MIGRATION_NAMES = [migration.__name__ for migration in MIGRATIONS]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_migrate_applies_what_is_missing_then_has_nothing_to_apply(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    store = {"path": str(tmp_path / "new.db")}
    if engine == "postgresql":
        store = {"url": request.getfixturevalue("postgres").database()}
    config = str(write_config(tmp_path / "proxy.json", {"store": store}))

    assert main(["migrate", "--config", config]) == 0
    out, err = capsys.readouterr()
    assert f"({engine}): applied {len(MIGRATION_NAMES)} migration(s): {', '.join(MIGRATION_NAMES)}\n" in out
    assert "already" not in out
    assert err == ""

    assert main(["migrate", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "applied" not in out.replace("already applied", "")
    assert f"({engine}): {len(MIGRATION_NAMES)} already applied, up to {MIGRATION_NAMES[-1]}; nothing else" in out


def test_replicas_migrating_at_once_all_start(postgres: PostgresServer, tmp_path: Path) -> None:
    """Several processes migrating one new database together: the advisory lock lets one apply each migration,
    the others wait and find it applied; none fails on a table another created."""
    config = str(write_config(tmp_path / "proxy.json", {"store": {"url": postgres.database()}}))
    command = [sys.executable, "-m", "proxy", "migrate", "--config", config]
    processes = [
        subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [(process.wait(timeout=120), *process.communicate()) for process in processes]

    assert [(code, err) for code, _, err in results] == [(0, "")] * 4
    assert all(MIGRATION_NAMES[-1] in out for _, out, _ in results)
    assert [row[0] for row in committed_rows(postgres_url(config), "SELECT name FROM migrations ORDER BY name")] == (
        MIGRATION_NAMES
    )


def postgres_url(config: str) -> str:
    url: str = json.loads(Path(config).read_text())["store"]["url"]
    return url


def test_migrate_refuses_a_newer_schema_and_an_unreachable_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newer = str(write_config(tmp_path / "newer.json", {"store": {"path": str(tmp_path / "newer.db")}}))
    assert main(["migrate", "--config", newer]) == 0
    with sqlite3.connect(tmp_path / "newer.db") as db:
        db.execute("INSERT INTO migrations (name, applied_at) VALUES ('m999_future', 0)")
    capsys.readouterr()
    absent = {"store": {"url": f"postgresql://nobody@127.0.0.1:{free_port()}/none"}}
    unreachable = str(write_config(tmp_path / "unreachable.json", absent))

    for config, message in ((newer, "m999_future"), (unreachable, "cannot connect to the store")):
        assert main(["migrate", "--config", config]) == EXIT_STORE
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("context-proxy: ")
        assert message in err
        assert err.count("\n") == 1


# --- a store path the proxy cannot or must not use: one line, EXIT_STORE, nothing written ------------------------

COMMANDS = ["serve", "migrate"]
LOCK_WAIT_S = 30
"""Bounds each command: the locked store is waited for `BUSY_TIMEOUT_MS` (10 s) before it is refused."""
STORE_PATHS = {
    "corrupt": "is not a SQLite database, or is damaged (file is not a database)",
    "truncated": "is not a SQLite database, or is damaged (database disk image is malformed)",
    "read-only file": "is read-only for this process",
    "read-only directory": "is in a read-only directory",
    "locked": "is locked by another process",
    "a directory": "is a directory",
    "another application's": "is another application's database (it has 1 table(s): messages)",
}


def migrated_store(path: Path) -> Path:
    config = write_config(path.parent / "migrate.json", {"store": {"path": str(path)}})
    subprocess.run(
        [sys.executable, "-m", "proxy", "migrate", "--config", str(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=LOCK_WAIT_S,
        check=True,
    )
    return path


def unprivileged() -> list[str]:
    """A prefix that makes file permissions hold for the command: as root they do not (CAP_DAC_OVERRIDE), so
    the command runs without that capability."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "running as root, where chmod does not stop writes: the read-only cases need setpriv (util-linux)"
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


@contextmanager
def bad_store(case: str, folder: Path) -> Iterator[tuple[Path, list[str]]]:
    """The store path of `case`, made so, and the prefix its commands run with."""
    folder.mkdir()
    path = folder / "store.db"
    if case == "corrupt":
        path.write_bytes(random.Random(29).randbytes(20_000))
    elif case == "truncated":
        with migrated_store(path).open("r+b") as file:
            file.truncate(10 * 4096)
    elif case == "read-only file":
        migrated_store(path).chmod(0o444)
    elif case == "read-only directory":
        migrated_store(path)
        folder.chmod(0o555)
    elif case == "a directory":
        path.mkdir()
    elif case == "another application's":
        with closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)")
            db.commit()
    if case == "locked":
        with closing(sqlite3.connect(migrated_store(path), isolation_level=None)) as locker:
            locker.execute("BEGIN EXCLUSIVE")
            yield path, []
        return
    try:
        yield path, unprivileged() if case.startswith("read-only") else []
    finally:
        folder.chmod(0o755)


def written(path: Path) -> object:
    """What a refused command could have written: the file's bytes and time, the files beside it. SQLite's
    -wal and -shm beside a WAL-mode file are left out: any reader of such a file makes them, without writing
    to the file (another application's, which is not in WAL mode, gets none: compared whole in
    `tests/unit/store/test_migrations.py`)."""
    beside = sorted(other.name for other in path.parent.iterdir() if not other.name.endswith(("-wal", "-shm")))
    return beside, path.read_bytes() if path.is_file() else None, path.stat().st_mtime_ns


@pytest.mark.parametrize("case", list(STORE_PATHS))
def test_a_store_path_it_cannot_use_is_one_line_and_writes_nothing(case: str, tmp_path: Path) -> None:
    """`serve` and `migrate` (at once), each: one line naming the store and what is wrong, no traceback, nothing
    written to the file."""
    with bad_store(case, tmp_path / "store") as (path, prefix):
        config = write_config(tmp_path / "proxy.json", {"store": {"path": str(path)}, "server": {"port": free_port()}})
        before = written(path)
        commands = [[*prefix, sys.executable, "-m", "proxy", command, "--config", str(config)] for command in COMMANDS]
        processes = [
            subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for command in commands
        ]
        try:
            results = [(process.wait(timeout=LOCK_WAIT_S), *process.communicate()) for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:  # a command that served instead of refusing
                    process.kill()
                    process.communicate()
        after = written(path)

    for code, out, err in results:
        assert (code, out) == (EXIT_STORE, ""), err
        assert err.startswith(f"context-proxy: the store {path} ")
        assert STORE_PATHS[case] in err
        assert err.count("\n") == 1
    assert after == before
