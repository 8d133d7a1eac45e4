"""Child processes on 127.0.0.1: started, waited for until healthy, stopped with whatever they spawned.

Benchmarks run each server in its own process (one GIL each, like production), so that a server's cost is not
the client's. Memory is read from /proc: VmHWM (the peak resident set) of a process, or of a process tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
"""The checkout these benchmarks belong to."""
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
HEALTH_POLL_S = 0.1
HEALTH_TIMEOUT_S = 2.0
LOG_TAIL_CHARS = 2000
RSS_POLL_S = 0.25


def python(*args: str) -> list[str]:
    """The argv of a child running this interpreter."""
    return [sys.executable, *args]


def checkout_env(root: Path = ROOT) -> dict[str, str]:
    """This environment, with the checkout `root` first on the import path."""
    return {**os.environ, "PYTHONPATH": str(root)}


@contextmanager
def process(
    argv: list[str],
    health: str,
    *,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    root: Path = ROOT,
    start_timeout: float = START_TIMEOUT_S,
    stop_timeout: float = STOP_TIMEOUT_S,
    stop_signal: signal.Signals = signal.SIGTERM,
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` run from the checkout `root` (by default with `root` on PYTHONPATH), yielded once `health` answers
    at all; on exit stopped with `stop_signal`, killed after `stop_timeout`, and so is any process it spawned."""
    sink = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        child = subprocess.Popen(
            argv,
            cwd=root,
            env=dict(env) if env is not None else checkout_env(root),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    finally:
        if not isinstance(sink, int):
            sink.close()
    spawned: set[int] = set()
    try:
        _wait_healthy(child, health, log, start_timeout)
        spawned.update(process_tree(child.pid)[1:])
        yield child
    finally:
        spawned.update(process_tree(child.pid)[1:])
        child.send_signal(stop_signal)
        try:
            child.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(STOP_TIMEOUT_S)
        for pid in spawned:  # a worker its parent did not take down
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_healthy(child: subprocess.Popen[bytes], health: str, log: Path | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(health, timeout=HEALTH_TIMEOUT_S)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline or child.poll() is not None:
                tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log is not None else "(no log kept)"
                raise RuntimeError(f"{child.args!r} did not start:\n{tail}") from None
            time.sleep(HEALTH_POLL_S)


# --- memory --------------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, `pid` first."""
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(_children(current))
    return tree


def status_kb(pid: int, key: str) -> int:
    """A `kB` line of /proc/PID/status (VmRSS, VmHWM); 0 for a process gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mib(pid: int) -> float:
    """The process's VmHWM (peak resident memory) in MiB."""
    return status_kb(pid, "VmHWM") / 1024


@dataclass
class Memory:
    """Per server: the peak VmHWM of every process seen in its tree, and the peak of the tree's summed VmRSS."""

    hwm_kb: dict[int, int] = field(default_factory=dict)
    peak_sum_rss_kb: int = 0

    def sample(self, root: int) -> None:
        total = 0
        for pid in process_tree(root):
            total += status_kb(pid, "VmRSS")
            self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), status_kb(pid, "VmHWM"))
        self.peak_sum_rss_kb = max(self.peak_sum_rss_kb, total)

    @property
    def hwm_sum_mib(self) -> float:
        return sum(self.hwm_kb.values()) / 1024

    @property
    def hwm_max_mib(self) -> float:
        return max(self.hwm_kb.values(), default=0) / 1024


class MemoryWatch:
    """A thread that samples each watched server's process tree until stopped; `sample` once more at the end,
    since VmHWM is a high-water mark and a server's last peak may fall between two polls."""

    def __init__(self) -> None:
        self.roots: dict[str, int] = {}
        self.memory: dict[str, Memory] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pid: int) -> None:
        self.memory[name] = Memory()
        self.roots[name] = pid

    def sample(self) -> None:
        for name, pid in list(self.roots.items()):
            self.memory[name].sample(pid)

    def _run(self) -> None:
        while not self._stop.wait(RSS_POLL_S):
            self.sample()

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
