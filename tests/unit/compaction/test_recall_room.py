"""The room a turn's recall gets (`proxy.compaction.recall_room`), pure."""

from __future__ import annotations

from proxy.compaction.recall_room import RecallRoom, recall_room

ROOM = {"budget": 4000, "growth": 100, "acknowledgements": 14, "limit": 1024, "fill": True}


def test_the_room_is_the_same_at_each_of_a_turn_s_requests() -> None:
    first = recall_room(tokens=3000, turn=0, **ROOM)
    assert first == RecallRoom(4000 - 3000 - 100 - 14, fill=True)
    # The turn's steps add up to its growth: the room stays as it was.
    assert recall_room(tokens=3060, turn=60, **ROOM) == first
    assert recall_room(tokens=3100, turn=100, **ROOM) == first


def test_a_turn_that_outgrows_its_room_gets_what_is_left_for_its_question_only() -> None:
    assert recall_room(tokens=3500, turn=500, **ROOM) == RecallRoom(4000 - 3500 - 14, fill=False)
    assert recall_room(tokens=3990, turn=900, **ROOM).tokens <= 0


def test_the_room_is_within_the_limit() -> None:
    assert recall_room(tokens=1000, turn=0, **ROOM) == RecallRoom(1024, fill=True)


def test_a_room_smaller_than_a_turn_is_not_filled() -> None:
    """Filling costs the next turn this one's messages again, uncached: not for less than they are."""
    assert recall_room(tokens=3800, turn=0, **ROOM) == RecallRoom(86, fill=False)
    assert recall_room(tokens=1000, turn=0, **{**ROOM, "growth": 2000}) == RecallRoom(986, fill=False)
    assert recall_room(tokens=3000, turn=0, **{**ROOM, "fill": False}).fill is False


def test_a_turn_that_is_one_request_fills_all_the_budget_leaves() -> None:
    """A chat's turn (no tools declared, none called) has no step after its question that would re-send the
    recall: its fill takes the budget's whole room, past `recall_tokens`; what the question asks about stays within
    it."""
    chat = {**ROOM, "steps": False}
    assert recall_room(tokens=3000, turn=0, **chat) == RecallRoom(4000 - 3000 - 14, fill=True, asked=986)
    assert recall_room(tokens=1000, turn=0, **chat) == RecallRoom(4000 - 1000 - 14, fill=True, asked=1024)
    # Too small a room for a turn is not filled: what the question asks about only, as before.
    assert recall_room(tokens=3900, turn=0, **chat) == RecallRoom(86, fill=False)
    assert recall_room(tokens=1000, turn=0, **{**chat, "fill": False}) == RecallRoom(1024, fill=False)
    assert recall_room(tokens=4000, turn=0, **chat).tokens <= 0


def test_a_turn_that_may_go_on_in_tool_steps_keeps_its_room_as_before() -> None:
    assert recall_room(tokens=1000, turn=0, **ROOM) == recall_room(tokens=1000, turn=0, **ROOM, steps=True)
    assert recall_room(tokens=1000, turn=0, **ROOM).asked is None
