"""What the builder reads about a request's path beyond its stored messages: which positions the session
pinned (API or `context.pin_patterns`) and, when `tool-results` runs, what each tool output costs as its stub.

Stubs are computed once per message and encoding and remembered (bounded): an agent re-sends its whole history
every turn, and its tool outputs are most of it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from proxy.canonical.sharing import shared_prefix
from proxy.canonical.types import Message
from proxy.compaction.groups import Cuts, cut_points, with_tool_groups
from proxy.compaction.layout import Item
from proxy.compaction.spans import CompactionRequest
from proxy.compaction.stubs import stubbed_message, tool_stubs
from proxy.config.schema import TOOL_RESULTS, ContextConfig
from proxy.history.messages import StoredMessage, StoredPath
from proxy.history.pins import Pins, pattern_pinned
from proxy.offload import compute
from proxy.tokens import count_message, rough_size

ITEM_CACHE_ENTRIES = 100_000
"""Builder items remembered (~150 bytes each): a few long sessions' paths."""
STUB_CACHE_ENTRIES = 20_000
"""Tool-output stubs remembered by message (~300 bytes each): a re-sent history is not stubbed again."""
READ_TOKENS = 16_000_000
"""About how many tokens of paths the remembered reads hold in all (each holds its path's stored messages, which
the history's recent paths may have let go of: ~64 MB of text); the least recent sessions' go first."""


@dataclass(frozen=True)
class PathState:
    """What one request's builds read: its items (pins and stub costs known) and the stubs' texts."""

    items: list[Item]
    stubs: Mapping[int, str]
    """Position → the stub of the tool output there (`PathStubs`)."""
    cuts: Cuts
    """`Cuts.of(items)`."""


class PathStubs(Mapping[int, str]):
    """A path's tool-output stubs by position, looked up by message id in its session's stubs (which are only
    ever added to, so a request's state is not copied from the last one, and stays right for it)."""

    def __init__(self, path: Sequence[StoredMessage], by_id: Mapping[str, tuple[str, int]]) -> None:
        self._path = path
        self._by_id = by_id

    def __getitem__(self, position: int) -> str:
        if not 0 <= position < len(self._path):
            raise KeyError(position)
        return self._by_id[self._path[position].id][0]

    def __iter__(self) -> Iterator[int]:
        return (position for position, stored in enumerate(self._path) if stored.id in self._by_id)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True)
class _Read:
    """A session's last read: its path, pins, items and cut points, and the session's stubs."""

    path: StoredPath
    pinned: frozenset[int]
    items: list[Item]
    stubs: dict[str, tuple[str, int]]
    """Message id → the tool output's stub and what its message costs stubbed: every one the session's reads
    met, only ever added to."""
    cuts: Cuts
    tokens: int
    """What the path's messages count (`READ_TOKENS`)."""


class PathReader:
    """Builder items for a request's path. A session's next request re-sends its path as the same stored
    objects (`History` hands out its cached entries, `proxy.canonical.sharing`), so its last read is carried over for
    that prefix, with the same pins, and only the new messages are read."""

    def __init__(self, config: ContextConfig, pins: Pins | None = None, max_tokens: int = READ_TOKENS) -> None:
        self._config = config
        self._max_tokens = max_tokens
        self._pins = pins
        self._stubs: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        """(message id, encoding) → the tool output's stub and what its message costs."""
        self._items: OrderedDict[tuple[str, int, bool, int | None], Item] = OrderedDict()
        """(message id, its tokens, pinned, stub cost) → its builder item: a path is mostly what the previous
        request's was, and an item is the same for the same message."""
        self._last: OrderedDict[tuple[str, str, str, bool], _Read] = OrderedDict()
        """(tenant, session, encoding, stubbing) → the session's last read."""
        self._tokens = 0

    async def read(self, request: CompactionRequest) -> PathState:
        """The builder's items for `request`'s path (pins and, when `tool-results` runs, stub costs known)."""
        pinned = await self._pinned(request)
        stubbing = TOOL_RESULTS in (request.strategies or self._config.strategies)
        key = (request.tenant, request.session_id, request.encoding, stubbing)
        path = request.path
        last = self._last.pop(key, None)
        if last is not None:
            self._tokens -= last.tokens
        shared = shared_prefix(path, last.path) if last is not None and last.pinned == pinned else 0
        items = last.items[:shared] if last is not None and shared else []
        stubs = {} if last is None else last.stubs
        if stubbing:
            stubs.update(await self._stub_costs(request, shared, stubs))
        items.extend(
            self._item(stored, position in pinned, stubs[stored.id][1] if stored.id in stubs else None)
            for position, stored in enumerate(path[shared:], shared)
        )
        while len(self._items) > ITEM_CACHE_ENTRIES:
            self._items.popitem(last=False)
        cuts = Cuts.of(items, None if last is None else last.cuts, shared)
        tokens = path.tokens
        if tokens <= self._max_tokens:
            self._last[key] = _Read(path, pinned, items, stubs, cuts, tokens)
            self._tokens += tokens
            while self._tokens > self._max_tokens:
                self._tokens -= self._last.popitem(last=False)[1].tokens
        return PathState(items, PathStubs(path, stubs), cuts)

    def _item(self, stored: StoredMessage, pinned: bool, stub_tokens: int | None) -> Item:
        key = (stored.id, stored.tokens, pinned, stub_tokens)
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = builder_item(stored, pinned=pinned, stub_tokens=stub_tokens)
        return item

    async def _pinned(self, request: CompactionRequest) -> frozenset[int]:
        """Positions the session pinned by the API, or whose text matches `context.pin_patterns`."""
        ids = await self._pins.on_session(request.tenant, request.session_id) if self._pins is not None else frozenset()
        patterns = self._config.pin_patterns
        if not ids and not patterns:
            return frozenset()
        size = sum(map(rough_size, request.messages)) if patterns else 0
        return frozenset(await compute(size, pinned_positions, request.path, ids, patterns, request.messages))

    async def _stub_costs(
        self, request: CompactionRequest, start: int, known: Mapping[str, tuple[str, int]]
    ) -> dict[str, tuple[str, int]]:
        """Message id → (stub, what its message costs stubbed) for the path's tool outputs from `start` on that
        `known` lacks; each computed once."""
        found: dict[str, tuple[str, int]] = {}
        missing: set[int] = set()
        for position in range(start, len(request.path)):
            stored = request.path[position]
            if stored.role == "tool" and stored.id not in known:
                cached = self._stubs.get((stored.id, request.encoding))
                if cached is None:
                    missing.add(position)
                else:
                    self._stubs.move_to_end((stored.id, request.encoding))
                    found[stored.id] = cached
        if missing:
            size = sum(rough_size(request.path[p].message) for p in missing)
            fresh = await compute(size, _stubs_with_costs, request.path, missing, request.encoding)
            for position, stub in fresh.items():
                found[request.path[position].id] = stub
                self._stubs[(request.path[position].id, request.encoding)] = stub
            while len(self._stubs) > STUB_CACHE_ENTRIES:
                self._stubs.popitem(last=False)
        return found


def pinned_positions(
    path: Sequence[StoredMessage],
    pinned_ids: Set[str],
    patterns: Sequence[re.Pattern[str]],
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> dict[int, str]:
    """Position → how the session pinned it: 'api' (its id is among `pinned_ids`: `POST /sessions/{id}/pins`) or
    'pattern' (its text matches `context.pin_patterns`); 'api' when both. `messages`: the texts the patterns
    are matched against, when not the path's own."""
    texts = [stored.message for stored in path] if messages is None else messages
    by_pattern = dict.fromkeys(pattern_pinned(patterns, texts), "pattern")
    return by_pattern | {position: "api" for position, stored in enumerate(path) if stored.id in pinned_ids}


def pinned_groups(
    path: Sequence[StoredMessage], pinned_ids: Set[str], patterns: Sequence[re.Pattern[str]]
) -> dict[int, str]:
    """`pinned_positions`, each with its whole tool group (as the builder keeps them): what the pin views show
    and what a pin must leave room for."""
    pinned = pinned_positions(path, pinned_ids, patterns)
    cuts = cut_points([builder_item(stored) for stored in path])
    by_api = with_tool_groups(cuts, [position for position, how in pinned.items() if how == "api"])
    by_pattern = with_tool_groups(cuts, sorted(position for position, how in pinned.items() if how == "pattern"))
    return dict.fromkeys(by_pattern, "pattern") | dict.fromkeys(by_api, "api")


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
    def message_at(position: int) -> Message:  # only the new outputs' turns are read, not the whole path
        return path[position].message

    return {
        position: (stub, count_message(stubbed_message(message_at(position), stub), encoding))
        for position, stub in tool_stubs(message_at, wanted)
    }
