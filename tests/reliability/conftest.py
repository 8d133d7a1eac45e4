"""Every reliability test is bounded in time: an alarm fails a test that outlives its budget.

The individual waits inside the tests are bounded too (client timeouts, deadlines); this is the backstop
for a hang nobody foresaw. A test may ask for a longer budget with `@pytest.mark.time_budget(seconds)`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

DEFAULT_BUDGET_S = 120


class BudgetExceeded(Exception):
    """Raised in the main thread by the alarm when a test runs over its budget."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "time_budget(seconds): fail the test after this many seconds")


@pytest.fixture(autouse=True)
def time_budget(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("time_budget")
    seconds = int(marker.args[0]) if marker is not None else DEFAULT_BUDGET_S
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise BudgetExceeded(f"{request.node.nodeid} ran over its {seconds} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
