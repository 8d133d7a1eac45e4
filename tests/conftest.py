"""Shared fixtures: one fake upstream per test session, a served proxy per test, OpenAI SDK clients.

The suites: `tests/unit` (one module at a time, no served proxy), `tests/e2e` (the proxy served by uvicorn, driven
by the official SDKs and CLIs), `tests/reliability` (attacks, faults, load; bounded in time), and
`tests/support` (the fakes and servers they share). Tests in e2e and reliability are marked `e2e`; a test that
needs the PostgreSQL server is marked `postgres`; a property test of many or rejected examples, or one that runs
the proxy's code in a child process, is marked `slow`. `pytest -m "not e2e and not postgres and not slow"` is the
fast unit suite: no PostgreSQL, no browser, no served proxy.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import settings

from proxy import environment
from proxy.serving import heap
from proxy.store.database import Database
from tests.support.fake_upstream import FakeUpstream
from tests.support.postgres_server import PostgresServer
from tests.support.proxy_server import ProxyServer, make_config

ServeProxy = Callable[..., ProxyServer]

TESTS = Path(__file__).resolve().parent
SERVED_FOLDERS = ("e2e", "reliability")
"""The suites that serve the proxy: every test in them is marked `e2e`."""
LITELLM_FROZEN = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    # What `context-proxy serve` does first: tests count tokens and build upstreams without serving.
    environment.prepare()
    # A property test is judged by what it finds, not by how long an example took: no timed assertion in a test
    # (a loaded machine, or an encoding read by the first example, would fail Hypothesis's default deadline).
    settings.register_profile("untimed", deadline=None)
    settings.load_profile("untimed")
    # Collecting imports modules, whose objects are no garbage: the collector waits until they are all loaded.
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    # What `serve` does once loaded: the modules' objects and the collected tests left out of the collector's full
    # passes, which would otherwise walk them again and again through the session (seconds of the fast suite).
    heap.freeze_loaded()
    gc.enable()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    # LiteLLM (~300,000 objects) loads with the first test that calls it: left out of the full passes once that
    # test's fixtures are gone.
    yield
    if "litellm" in sys.modules and not item.config.stash.get(LITELLM_FROZEN, False):
        item.config.stash[LITELLM_FROZEN] = True
        heap.freeze_loaded()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave the served suites' folders unimported when the mark expression leaves out every `e2e` test (the fast
    unit suite's `not e2e and ...`): importing and rewriting their modules costs seconds, for tests deselected
    anyway. Only a plain conjunction is read so; any other expression collects everything, as pytest would."""
    if collection_path.parent == TESTS and collection_path.name in SERVED_FOLDERS:
        terms = str(config.getoption("markexpr", "")).split()
        if "(" not in "".join(terms) and "or" not in terms and "not e2e" in " ".join(terms).split(" and "):
            return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        if any(folder in parts for folder in SERVED_FOLDERS):
            item.add_marker(pytest.mark.e2e)
        if "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the test session (on loopback, in a temp dir); a database per test."""
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a storage test's store lives, on each engine: a SQLite file in the test's own folder, or a fresh
    database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return tmp_path / "store.sqlite"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.database()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store as `Database.open` leaves a new file, made once a session (on a thread of its own, away from
    the tests' event loops): each SQLite `db` starts from a copy, as migrating each test's file was most of a
    store test's time."""
    path = tmp_path_factory.mktemp("migrated") / "store.sqlite"

    async def migrate() -> None:
        await (await Database.open(path)).close()

    with ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, migrate()).result()
    return path


@pytest.fixture
async def db(store_target: Path | str, migrated_sqlite: Path) -> AsyncIterator[Database]:
    """A real store, on each engine (the tests that use it run twice)."""
    if isinstance(store_target, Path):
        shutil.copyfile(migrated_sqlite, store_target)
    database = await Database.open(store_target)
    yield database
    await database.close()


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture
def fake(upstream_server: FakeUpstream) -> Iterator[FakeUpstream]:
    upstream_server.reset()
    yield upstream_server
    upstream_server.reset()


@pytest.fixture
def serve_proxy(tmp_path: Path, fake: FakeUpstream) -> Iterator[ServeProxy]:
    """Start a proxy on the fake upstream; keyword arguments replace top-level config sections."""
    servers: list[ProxyServer] = []

    def start(**overrides: Any) -> ProxyServer:
        server = ProxyServer(make_config(tmp_path, fake.url, **overrides), tmp_path).__enter__()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        server.__exit__(None, None, None)


@pytest.fixture
def proxy(serve_proxy: ServeProxy) -> ProxyServer:
    return serve_proxy()


@pytest.fixture
def client(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    # Closed after the test: an SDK client left to the garbage collector leaks sockets (ResourceWarning → error).
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=20) as sdk:
        yield sdk


@pytest.fixture
async def async_client(proxy: ProxyServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=20) as sdk:
        yield sdk
