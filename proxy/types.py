"""Type aliases every stage shares, defined once.

The canonical conversation is OpenAI's chat-completions form: a list of chat messages, answered by
`chat.completion` objects or a stream of `chat.completion.chunk` objects. LiteLLM speaks it to every provider,
so the stages after a wire adapter see nothing else (docs/architecture.md, "The canonical form").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

JSONObject = dict[str, Any]
Message = dict[str, Any]
"""One chat message: role, content, and name / tool_calls / tool_call_id where present."""
Chunk = dict[str, Any]
"""A `chat.completion.chunk` (stream) or a `chat.completion` (non-stream) JSON object."""
Clock = Callable[[], float]
"""Seconds; `time.time` for stored timestamps, `time.monotonic` for durations. Injected so tests control time."""
