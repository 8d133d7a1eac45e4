"""Recall at a request's question: the archived originals the latest user message refers to, put into the
working context just before it (`recall`), within `context.recall_tokens` and what the budget leaves; with
`context.recall_fill` the room left is filled with hidden turns too, for that turn only (between crossings the
context grows back from the crossing's target to the budget, and a question is asked anywhere in between;
`recall_room`): a chat's question, whose turn is one request, up to the budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from proxy.compaction.groups import request_growth
from proxy.compaction.layout import ContextLayout
from proxy.compaction.path_items import PathState
from proxy.compaction.recall import Recall, recall_message
from proxy.compaction.recall_room import recall_room
from proxy.compaction.spans import CompactionRequest
from proxy.compaction.working_context import WorkingContext, message_index, with_recalled
from proxy.config.schema import ContextConfig
from proxy.tokens import content_text, count_message

UNRECALLED_SESSIONS = 4096
"""Sessions whose latest question this process remembers sending without a recall (the least recent go first)."""


class QuestionRecall:
    def __init__(self, config: ContextConfig, recall: Recall | None, acknowledgement: Callable[[str], int]) -> None:
        """`acknowledgement`: what an acknowledgement message costs in an encoding."""
        self._config = config
        self._recall = recall
        self._acknowledgement = acknowledgement
        self._unrecalled: OrderedDict[tuple[str, str], str] = OrderedDict()
        """(tenant, session) → the latest question, when this process last sent it without a recall."""

    async def recalled(
        self, request: CompactionRequest, context: ContextLayout, state: PathState, prepared: WorkingContext
    ) -> WorkingContext:
        """The working context with the archived passages the latest user message refers to, placed just before
        that message (acknowledged on each side, so turns alternate), within `context.recall_tokens` and what
        the budget leaves. Nothing is recalled while every original is sent."""
        latest = latest_question(request)
        if self._recall is None or self._config.recall_tokens <= 0 or latest is None:
            return prepared
        # A question sent without a recall keeps none through its turn: a crossing in the middle of the turn hides
        # what it followed, and a recall placed before it then would go at the next question, a break of the
        # prompt the upstream cached.
        unrecalled = self._unrecalled.get((request.tenant, request.session_id))
        if latest < len(request.path) - 1 and unrecalled == request.path[latest].id:
            return prepared
        recalled = await self._before(self._recall, request, context, state, prepared, latest)
        self.sent_unrecalled(request, None if recalled.recalled else latest)
        return recalled

    def sent_unrecalled(self, request: CompactionRequest, latest: int | None) -> None:
        """Remember that the session's latest question (at `latest`; None: it had a recall) went without one."""
        session = (request.tenant, request.session_id)
        self._unrecalled.pop(session, None)
        if latest is None or self._recall is None:
            return
        self._unrecalled[session] = request.path[latest].id
        while len(self._unrecalled) > UNRECALLED_SESSIONS:
            self._unrecalled.popitem(last=False)

    async def _before(
        self,
        recall: Recall,
        request: CompactionRequest,
        context: ContextLayout,
        state: PathState,
        prepared: WorkingContext,
        latest: int,
    ) -> WorkingContext:
        """`recalled`'s passages for the question at `latest`, placed before it."""
        if not prepared.summaries and not context.stubbed:
            return prepared
        shown = {part for part in context.parts if isinstance(part, int) and part not in context.stubbed}
        if latest not in shown:
            return prepared
        acknowledgement = self._acknowledgement(request.encoding)
        at = message_index(context, latest)
        room = recall_room(
            budget=request.budget,
            tokens=prepared.tokens,
            turn=sum(count_message(message, request.encoding) for message in prepared.messages[at + 1 :]),
            growth=request_growth(state.items, state.cuts, end=latest),
            acknowledgements=2 * acknowledgement,
            limit=self._config.recall_tokens,
            fill=self._config.recall_fill,
            steps=request.tools or bool(state.cuts.caller),
        )
        # What the question follows is what it may find shown: the turn's own tool results after it would make the
        # recall come and go between the turn's requests, and with it their cached prefix. Only originals count:
        # a summary that names a word does not hold what was said of it.
        visible = "\n".join(
            content_text(request.path[part].message.get("content")) for part in sorted(shown) if part < latest
        )
        query = content_text(request.path[latest].message.get("content"))
        passages = await recall.passages(
            request.tenant,
            request.session_id,
            request.path,
            shown,
            visible,
            query,
            room.tokens,
            request.encoding,
            fill=room.fill,
            asked_tokens=room.asked,
        )
        if not passages:
            return prepared
        return with_recalled(prepared, at, recall_message(passages), len(passages), request.encoding, acknowledgement)


def latest_question(request: CompactionRequest) -> int | None:
    """Where the path's latest user message is."""
    path = request.path
    return next((at for at in range(len(path) - 1, -1, -1) if path[at].role == "user"), None)
