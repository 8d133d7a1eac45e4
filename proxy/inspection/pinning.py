"""Pinning and unpinning a session's messages: the one place pins are checked before they are written.

A pin takes a message's whole tool group, and is refused (nothing written) when the pinned and system messages
would no longer fit the session's input budget; the views of pins (`pins_view`) are what every pin route
answers with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from proxy.budget.budgets import Budgets
from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.compaction.groups import cut_points, with_tool_groups
from proxy.compaction.path_items import builder_item, pinned_groups
from proxy.config.models import ModelEntry
from proxy.config.schema import Config
from proxy.errors import InvalidRequest, json_type
from proxy.history.messages import StoredMessage
from proxy.history.pins import Pins
from proxy.history.store import History
from proxy.tokens import count_prompt

MAX_PIN_IDS = 1_000
"""Message ids one pin or unpin request may name."""
NAMED_IDS = 20
"""Ids an error lists before it says how many more there are."""
SHOWN_ID_CHARS = 100


@dataclass
class Pinning:
    config: Config
    history: History
    pins: Pins
    budgets: Budgets

    async def pin(
        self, tenant: str, session_id: str, entry: ModelEntry, encoding: str, ids: Sequence[str]
    ) -> dict[str, Any]:
        """Pin messages of the session's current path, each with its whole tool group, if the pinned messages
        and the system messages still fit the session's input budget; else a 400 and nothing written."""
        async with self.history.lock(tenant, session_id):
            path = await self.history.path(tenant, session_id, encoding) or []
            positions = {message.id: position for position, message in enumerate(path)}
            missing = [message_id for message_id in ids if message_id not in positions]
            if missing:
                raise InvalidRequest(
                    f"Not on the current path of session {session_id}: {_named(missing)}. Only the messages it "
                    f"shows (GET /sessions/{session_id}) can be pinned.",
                    param="message_ids",
                    code="message_not_found",
                )
            new = {path[p].id for p in _with_tool_groups(path, [positions[i] for i in ids])}
            stored = await self.pins.on_session(tenant, session_id)
            settings = await self.history.settings_on(tenant, path)
            budget = self.budgets.budget(entry, None, settings).input_budget
            pinned = pinned_groups(path, stored | new, self.config.context.pin_patterns)
            needed = count_prompt(
                message.tokens for p, message in enumerate(path) if p in pinned or message.role in SYSTEM_ROLES
            )
            if needed > budget:
                raise InvalidRequest(
                    f"The pinned messages {_named([path[p].id for p in sorted(pinned)])} and the system messages "
                    f"of session {session_id} need {needed} tokens, but the input budget for model "
                    f"'{entry.name}' is {budget} tokens. Pin fewer messages, or unpin some "
                    f"(DELETE /sessions/{session_id}/pins).",
                    param="message_ids",
                    code="pins_too_large",
                )
            await self.pins.add(tenant, session_id, sorted(new - stored))
            return self.view(session_id, path, stored | new)

    async def unpin(self, tenant: str, session_id: str, encoding: str, ids: Sequence[str]) -> dict[str, Any]:
        """Unpin messages (a message of the current path with its whole tool group); an id that is neither
        pinned nor on the path is a 400 and nothing is removed."""
        async with self.history.lock(tenant, session_id):
            path = await self.history.path(tenant, session_id, encoding) or []
            positions = {message.id: position for position, message in enumerate(path)}
            stored = await self.pins.on_session(tenant, session_id)
            unknown = [message_id for message_id in ids if message_id not in positions and message_id not in stored]
            if unknown:
                raise InvalidRequest(
                    f"Neither pinned nor on the current path of session {session_id}: {_named(unknown)}.",
                    param="message_ids",
                    code="message_not_found",
                )
            on_path = [positions[i] for i in ids if i in positions]
            gone = {i for i in ids if i not in positions} | {path[p].id for p in _with_tool_groups(path, on_path)}
            removed = await self.pins.remove(tenant, session_id, sorted(gone & stored)) if gone & stored else 0
            return {**self.view(session_id, path, stored - gone), "removed": removed}

    def view(self, session_id: str, path: Sequence[StoredMessage], stored: Set[str]) -> dict[str, Any]:
        """The session's pins as every pin route shows them: each message with how it is pinned."""
        return pins_view(session_id, path, pinned_groups(path, stored, self.config.context.pin_patterns))


def pins_view(session_id: str, path: Sequence[StoredMessage], pinned: Mapping[int, str]) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "pins": [
            {
                "message_id": path[position].id,
                "position": position,
                "role": path[position].role,
                "tokens": path[position].tokens,
                "pinned_by": pinned[position],
            }
            for position in sorted(pinned)
        ],
    }


def checked_ids(message_ids: Any) -> list[str]:
    """`message_ids` of a pin request: a non-empty list of at most `MAX_PIN_IDS` strings, without repeats."""
    if not isinstance(message_ids, list) or not message_ids:
        raise InvalidRequest(
            f"'message_ids' must be a non-empty array of message ids, not {json_type(message_ids)}.",
            param="message_ids",
        )
    if len(message_ids) > MAX_PIN_IDS:
        raise InvalidRequest(
            f"'message_ids' names {len(message_ids)} messages; at most {MAX_PIN_IDS} fit in one request.",
            param="message_ids",
        )
    for index, message_id in enumerate(message_ids):
        if not isinstance(message_id, str) or not message_id:
            raise InvalidRequest(
                f"message_ids[{index}] must be a message id (a non-empty string), not {json_type(message_id)}.",
                param="message_ids",
            )
    return list(dict.fromkeys(message_ids))


def _with_tool_groups(path: Sequence[StoredMessage], positions: Sequence[int]) -> set[int]:
    return with_tool_groups(cut_points([builder_item(message) for message in path]), positions)


def _named(ids: Sequence[str]) -> str:
    """Ids for an error message: quoted, cut, the first `NAMED_IDS` of them."""
    shown = ", ".join(f"'{message_id[:SHOWN_ID_CHARS]}'" for message_id in ids[:NAMED_IDS])
    return shown + (f" and {len(ids) - NAMED_IDS} more" if len(ids) > NAMED_IDS else "")
