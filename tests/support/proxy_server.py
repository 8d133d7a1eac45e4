"""The proxy served by a real uvicorn on 127.0.0.1, for end-to-end tests.

`ProxyServer` runs the app in a thread of the test process (fast to start; the test can reach in with a
plain SQLite connection); `ProxyProcess` runs `python -m proxy serve` as a child process, for the tests that
kill it with SIGKILL. Both bind a free loopback port and always stop by themselves.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import uvicorn
from starlette.types import ASGIApp

from proxy.config.schema import Config, parse_config
from proxy.serving.app import create_app
from proxy.serving.server import server_options

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
"""A `serve` process imports LiteLLM and migrates its store before it answers: a few seconds alone, past 30 s on
a shared machine under load. A bound on a failure, not a speed target."""
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def make_config(tmp_path: Path, upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """A config dict with a 'fake' model on the fake upstream; `overrides` replace top-level sections."""
    raw: dict[str, Any] = {
        "store": {"path": str(tmp_path / "store.db")},
        "models": [
            {
                "name": "fake",
                "model": "openai/fake-model",
                "api_base": upstream_url,
                "api_key": "sk-upstream-secret",
                "context_window": 8192,
                "max_output": 1024,
            },
        ],
        "upstream": {"timeout_s": 10},
    }
    raw.update(overrides)
    return raw


class ProxyServer:
    def __init__(
        self, raw_config: dict[str, Any], base_dir: Path, middleware: Callable[[ASGIApp], ASGIApp] | None = None
    ) -> None:
        """`middleware` wraps the app (a benchmark's recorder of what a client sent)."""
        self.config: Config = parse_config(raw_config, base_dir=base_dir, environ=os.environ)
        self.port = free_port()
        app: ASGIApp = create_app(self.config)
        self._server = uvicorn.Server(
            uvicorn.Config(
                middleware(app) if middleware is not None else app,
                host=HOST,
                port=self.port,
                log_level="warning",
                lifespan="on",
                log_config=None,
                loop="asyncio",  # a plain loop per test thread: uvloop's handle teardown warns at interpreter exit
                **server_options(self.config.server),
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="proxy-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.should_exit = True
        self._thread.join(STOP_TIMEOUT_S)


class ProxyProcess:
    """`python -m proxy serve` in a child process: the only way to test a real SIGKILL."""

    def __init__(
        self,
        raw_config: dict[str, Any],
        workdir: Path,
        log_level: str | None = "warning",
        start_timeout_s: float | None = None,
    ) -> None:
        """`log_level` None: the config's `logging.level`; `start_timeout_s` None: `START_TIMEOUT_S`."""
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.log_level = log_level
        self.config_path = workdir / "proxy-config.json"
        self.config_path.write_text(json.dumps(raw_config))
        self.log_path = workdir / "proxy.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "proxy",
                    "serve",
                    "--config",
                    str(self.config_path),
                    "--host",
                    HOST,
                    "--port",
                    str(self.port),
                    *(["--log-level", self.log_level] if self.log_level else []),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + (START_TIMEOUT_S if self.start_timeout_s is None else self.start_timeout_s)
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the proxy exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError("the proxy did not become healthy in time")

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
