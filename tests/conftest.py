"""Shared fixtures: one fake upstream per test session, a served proxy per test, OpenAI SDK clients.

The suites: `tests/unit` (one module at a time, no served proxy), `tests/e2e` (the proxy served by uvicorn, driven
by the official SDKs and CLIs), `tests/reliability` (attacks, faults, load; bounded in time), and
`tests/support` (the fakes and servers they share). Tests in e2e and reliability are marked `e2e`; a test that
needs the PostgreSQL server is marked `postgres`. `pytest -m "not e2e and not postgres"` is the fast unit suite:
no PostgreSQL, no browser, no served proxy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy import environment
from proxy.store.database import Database
from tests.support.fake_upstream import FakeUpstream
from tests.support.postgres_server import PostgresServer
from tests.support.proxy_server import ProxyServer, make_config

ServeProxy = Callable[..., ProxyServer]


def pytest_configure(config: pytest.Config) -> None:
    # What `context-proxy serve` does first: tests count tokens and build upstreams without serving.
    environment.prepare()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        if "e2e" in parts or "reliability" in parts:
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


@pytest.fixture
async def db(store_target: Path | str) -> AsyncIterator[Database]:
    """A real store, on each engine (the tests that use it run twice)."""
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
