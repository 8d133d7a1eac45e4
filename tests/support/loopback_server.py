"""A Starlette app served by uvicorn on 127.0.0.1 in a thread of the test process: the fake providers' lifecycle.

Started on a free port (kept across restarts, so a test can stop a provider and bring it back at the same
address), stopped gracefully and then by force: no server a test starts outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from types import TracebackType
from typing import Self

import uvicorn
from starlette.types import ASGIApp

START_TIMEOUT_S = 10.0
GRACEFUL_SHUTDOWN_S = 1
STOP_TIMEOUT_S = 5.0
HOST = "127.0.0.1"
START_POLL_S = 0.01
SHUTDOWN_POLL_S = 0.005


class IntentionalDrop(Exception):
    """Raised inside a stream body so uvicorn closes the connection without ending the chunked body."""


class _HideIntentionalDrops(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, IntentionalDrop)


_HIDE_DROPS = _HideIntentionalDrops()


class _Server(uvicorn.Server):
    """uvicorn's server, woken by `stopping` rather than finding `should_exit` at its next 0.1 s tick: a test's
    teardown does not wait out a tick (the fakes start and stop a few thousand times a suite)."""

    stopping: asyncio.Event | None = None

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            if self.stopping is None:
                await asyncio.sleep(0.1)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown without its fixed 0.1 s pause: the connections asked to close are waited for, as
        long as the graceful timeout allows, then their tasks cancelled (no lifespan: the fakes run without)."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        deadline = time.monotonic() + GRACEFUL_SHUTDOWN_S
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(SHUTDOWN_POLL_S)
        for task in self.server_state.tasks:
            task.cancel(msg="the fake provider stopped")


class LoopbackServer:
    def __init__(self, app: ASGIApp, name: str, path: str = "") -> None:
        """`path` follows the address in `url` (`/v1` for OpenAI's APIs, nothing for Anthropic's)."""
        self._app = app
        self._name = name
        self._path = path
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._port: int | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError(f"{self._name} has not been started")
        return f"http://{HOST}:{self._port}{self._path}"

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} is already running")
        logging.getLogger("uvicorn.error").addFilter(_HIDE_DROPS)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # As a provider's servers send: each event at once. (asyncio sets it only on sockets made with
        # IPPROTO_TCP; without it a stream's first event waited ~40 ms for the client's delayed ACK.) Linux
        # gives it to the accepted connections.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((HOST, self._port or 0))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            log_level="warning",
            log_config=None,
            access_log=False,
            loop="asyncio",
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        server = _Server(config)
        thread = threading.Thread(target=self._run, args=(server, sock), name=self._name, daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                sock.close()
                raise RuntimeError(f"{self._name} did not start")
            time.sleep(START_POLL_S)

    def _run(self, server: _Server, sock: socket.socket) -> None:
        asyncio.run(self._serve(server, sock))

    async def _serve(self, server: _Server, sock: socket.socket) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        server.stopping = self._stopping
        await server.serve(sockets=[sock])

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            # `_stopping` cuts scripted delays short; the loop is already closed if the thread died on its own.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        server.should_exit = True
        thread.join(GRACEFUL_SHUTDOWN_S + 1.0)
        if thread.is_alive():
            server.force_exit = True
            thread.join(STOP_TIMEOUT_S)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
