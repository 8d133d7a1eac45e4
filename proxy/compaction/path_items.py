"""What the builder reads about a request's path beyond its stored messages: which positions the session
pinned (API or `context.pin_patterns`) and, when `tool-results` runs, what each tool output costs as its stub.

Stubs are computed once per message and encoding and remembered (bounded): an agent re-sends its whole history
every turn, and its tool outputs are most of it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.compaction.layout import TOOL_RESULTS, Item
from proxy.compaction.spans import CompactionRequest
from proxy.compaction.stubs import stubbed_message, tool_stubs
from proxy.config import ContextConfig
from proxy.history.messages import StoredMessage
from proxy.history.pins import Pins, pattern_pinned
from proxy.offload import compute
from proxy.tokens import count_message, rough_size

STUB_CACHE_ENTRIES = 20_000
"""Tool-output stubs remembered by message (~300 bytes each): a re-sent history is not stubbed again."""


@dataclass(frozen=True)
class PathState:
    """What one request's builds read: its items (pins and stub costs known) and the stubs' texts."""

    items: list[Item]
    stubs: Mapping[int, str]


class PathReader:
    def __init__(self, config: ContextConfig, pins: Pins | None = None) -> None:
        self._config = config
        self._pins = pins
        self._stubs: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        """(message id, encoding) → the tool output's stub and what its message costs."""

    async def read(self, request: CompactionRequest) -> PathState:
        """The builder's items for `request`'s path (pins and, when `tool-results` runs, stub costs known)."""
        pinned = await self._pinned(request)
        strategies = request.strategies or self._config.strategies
        stubs = await self._stub_costs(request) if TOOL_RESULTS in strategies else {}
        items = [
            builder_item(
                stored, pinned=position in pinned, stub_tokens=stubs[position][1] if position in stubs else None
            )
            for position, stored in enumerate(request.path)
        ]
        return PathState(items, {position: stub for position, (stub, _) in stubs.items()})

    async def _pinned(self, request: CompactionRequest) -> frozenset[int]:
        """Positions the session pinned by the API, or whose text matches `context.pin_patterns`."""
        ids = await self._pins.on_session(request.tenant, request.session_id) if self._pins is not None else frozenset()
        by_api = {position for position, stored in enumerate(request.path) if stored.id in ids}
        patterns = self._config.pin_patterns
        if not patterns:
            return frozenset(by_api)
        size = sum(map(rough_size, request.messages))
        return frozenset(by_api | await compute(size, pattern_pinned, patterns, request.messages))

    async def _stub_costs(self, request: CompactionRequest) -> dict[int, tuple[str, int]]:
        """Position → (stub, what its message costs) for every tool output of the path; each computed once."""
        found: dict[int, tuple[str, int]] = {}
        missing: set[int] = set()
        for position, stored in enumerate(request.path):
            if stored.role == "tool":
                cached = self._stubs.get((stored.id, request.encoding))
                if cached is None:
                    missing.add(position)
                else:
                    self._stubs.move_to_end((stored.id, request.encoding))
                    found[position] = cached
        if missing:
            size = sum(rough_size(request.path[p].message) for p in missing)
            fresh = await compute(size, _stubs_with_costs, request.path, missing, request.encoding)
            for position, stub in fresh.items():
                found[position] = stub
                self._stubs[(request.path[position].id, request.encoding)] = stub
            while len(self._stubs) > STUB_CACHE_ENTRIES:
                self._stubs.popitem(last=False)
        return found


def builder_item(stored: StoredMessage, *, pinned: bool = False, stub_tokens: int | None = None) -> Item:
    message = stored.message
    calls = message.get("tool_calls") or ()
    call_ids = tuple(str(call.get("id")) for call in calls if isinstance(call, Mapping) and call.get("id"))
    tool_call_id = message.get("tool_call_id")
    return Item(
        role=stored.role,
        tokens=stored.tokens,
        tool_call_ids=call_ids,
        tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
        pinned=pinned,
        stub_tokens=stub_tokens,
    )


def _stubs_with_costs(path: Sequence[StoredMessage], wanted: set[int], encoding: str) -> dict[int, tuple[str, int]]:
    messages = [stored.message for stored in path]
    return {
        position: (stub, count_message(stubbed_message(messages[position], stub), encoding))
        for position, stub in tool_stubs(messages, wanted)
    }
