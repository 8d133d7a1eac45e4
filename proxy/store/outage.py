"""Whether the store's server can be reached, as the last attempt found it, and when to try it again.

A shared store (PostgreSQL) may go away for seconds (a restart, a failover) while the proxy keeps serving.
Then every request must fail at once with a 503 that says so, not wait on a connect timeout, and the store
must come back by itself: after a failure, one caller at a time is let through to try (the writer reconnecting,
a read, the lock connection), first after `FIRST_RETRY_S`, the wait doubling up to `MAX_RETRY_S`; any success
ends the outage. The writer thread and the event loop both report here, hence the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from proxy.errors import StoreUnavailable

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.25
MAX_RETRY_S = 2.0


class Outage:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._since = 0.0
        self._delay = FIRST_RETRY_S
        self._next_try = 0.0

    @property
    def reason(self) -> str | None:
        """Why the store is unreachable; None while it is not known to be."""
        return self._reason

    def admit(self) -> None:
        """Let the caller try the store, or raise `StoreUnavailable` at once while an outage waits out its
        back-off. Once the wait is over, the first caller is the one that tries; the others still fail fast."""
        if self._reason is None:
            return
        with self._lock:
            if self._reason is None:
                return
            now = self._clock()
            if now < self._next_try:
                raise self._error(self._next_try - now)
            self._next_try = now + self._delay  # this caller is the probe: the others wait for its outcome

    def failed(self, reason: str) -> StoreUnavailable:
        """Record that the store could not be reached; the error to raise."""
        with self._lock:
            now = self._clock()
            if self._reason is None:
                log.error("the store is unreachable: %s", reason)
                self._since = now
                self._delay = FIRST_RETRY_S
            else:
                self._delay = min(2 * self._delay, MAX_RETRY_S)
            self._reason = reason
            self._next_try = now + self._delay
            return self._error(self._delay)

    def recovered(self) -> None:
        """The store answered: the outage (if any) is over."""
        if self._reason is None:
            return
        with self._lock:
            if self._reason is not None:
                log.warning("the store is reachable again after %.1f s", self._clock() - self._since)
                self._reason = None

    @staticmethod
    def _error(retry_after_s: float) -> StoreUnavailable:
        # The reason (a host, a port) is for the operator's log, not for clients. Where the request's journal step
        # exists, the journal says what it kept instead (`StoreUnavailable.in_step`).
        return StoreUnavailable(
            "The proxy's store is unreachable: this request was not answered, and no answer was saved. Retry shortly.",
            retry_after_s=retry_after_s,
        )


def reason_of(exc: BaseException) -> str:
    """An exception as the one-line reason an outage records (libpq's messages span lines; a log line is one)."""
    return " ".join(str(exc).split()) or type(exc).__name__
