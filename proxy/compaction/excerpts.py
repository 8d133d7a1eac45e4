"""What a recalled message shows (`recall`): its text and tool calls whole when short, else an excerpt of whole
lines around the place where most of the question's terms meet. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from proxy.compaction.recall_terms import Term, term_pattern
from proxy.tokens import content_text

MAX_HITS_PER_TERM = 64
"""Matches of one term looked at in a long text: enough to find where the terms meet."""


def message_text(message: Mapping[str, Any]) -> str:
    """What a message is indexed and excerpted by: its text, then each tool call's name and arguments."""
    parts = [content_text(message.get("content"))]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return "\n".join(part for part in parts if part)


def message_excerpt(message: Mapping[str, Any], terms: Sequence[Term], max_chars: int) -> str:
    return excerpt(message_text(message), terms, max_chars)


def excerpt(text: str, terms: Sequence[Term], max_chars: int) -> str:
    """`text` when it is short; else at most `max_chars` of it (plus "…" marks where it was cut), whole lines
    where it can, around the place where most of the terms occur together."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    width = max(1, max_chars)
    lead = width // 4
    hit = _best_hit(text, terms, width, lead)
    hit_start, hit_end = hit if hit is not None else (0, 0)
    start = max(0, hit_start - lead)
    end = min(len(text), start + width)
    start = max(0, end - width)
    if start > 0:
        start = _cut_after(text, start, hit_start)
    if end < len(text):
        end = _cut_before(text, max(hit_end, start), end)
    body = text[start:end].strip()
    return ("… " if start > 0 else "") + body + (" …" if end < len(text) else "")


def _best_hit(text: str, terms: Sequence[Term], width: int, lead: int) -> tuple[int, int] | None:
    """The hit that begins the window (`lead` before it, `width` wide) holding the most distinct terms."""
    hits = sorted(_hits(text, terms))
    best: tuple[int, int] | None = None
    best_count = 0
    inside: Counter[int] = Counter()
    right = 0
    for left, (start, end, _) in enumerate(hits):
        while right < len(hits) and hits[right][1] <= start - lead + width:
            inside[hits[right][2]] += 1
            right += 1
        if len(inside) > best_count:
            best, best_count = (start, end), len(inside)
        if right > left:
            inside[hits[left][2]] -= 1
            if not inside[hits[left][2]]:
                del inside[hits[left][2]]
        else:
            right = left + 1
    return best if best is not None else (hits[0][:2] if hits else None)


def _hits(text: str, terms: Sequence[Term]) -> Iterator[tuple[int, int, int]]:
    for index, term in enumerate(terms):
        for match in islice(term_pattern(term).finditer(text), MAX_HITS_PER_TERM):
            yield match.start(), match.end(), index


def _cut_after(text: str, start: int, limit: int) -> int:
    """`start` moved past the next line break (else space) before `limit`, so the excerpt begins whole."""
    for separator in ("\n", " "):
        cut = text.find(separator, start, limit)
        if cut != -1:
            return cut + 1
    return start


def _cut_before(text: str, floor: int, end: int) -> int:
    """`end` moved back to the last line break (else space) after `floor`, so the excerpt ends whole."""
    for separator in ("\n", " "):
        cut = text.rfind(separator, floor, end)
        if cut != -1:
            return cut
    return end
