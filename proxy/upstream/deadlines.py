"""How long one upstream stream may take: until its first chunk, and in all.

LiteLLM's `timeout` (`upstream.timeout_s`) bounds each read, so an upstream that sends a byte just often enough
would hold a stream, its step and its Idempotency-Key for ever. These two deadlines are the proxy's own, set
when the call starts and enforced around the `Upstream` seam (the pipeline while the stream opens, the relay's
reader after), so they hold for every upstream; what the client hears is the timeout the upstream boundary
reports for a read timeout (`proxy.upstream.failures`), a 504 `upstream_timeout`. The total deadline also bounds
a whole non-stream call, which an upstream can drip as slowly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.config.schema import UpstreamConfig
from proxy.errors import UpstreamError
from proxy.upstream.failures import TIMEOUT


@dataclass(frozen=True)
class StreamDeadlines:
    """When a stream must have sent its first chunk and when it must have ended, in the event loop's clock."""

    first_chunk: float
    end: float

    @classmethod
    def from_now(cls, first_byte_s: float, total_s: float) -> StreamDeadlines:
        now = asyncio.get_running_loop().time()
        return cls(first_chunk=now + min(first_byte_s, total_s), end=now + total_s)

    @classmethod
    def from_config(cls, config: UpstreamConfig) -> StreamDeadlines:
        return cls.from_now(config.first_byte_timeout_s, config.stream_deadline_s)

    def exceeded(self, first_chunk_seen: bool) -> UpstreamError:
        """The error for the deadline that passed."""
        if first_chunk_seen or self.first_chunk >= self.end:
            return deadline_exceeded("The upstream stream did not end before the proxy's stream deadline.")
        return deadline_exceeded("The upstream sent nothing before the proxy's first-byte deadline.")


def deadline_exceeded(message: str) -> UpstreamError:
    return UpstreamError(message, status=504, error_type="timeout", code=TIMEOUT)
