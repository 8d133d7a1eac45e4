"""The X-Context-* headers every door shares: the options a request sets, and the report its answer carries.

Request headers (`X-Session-Id`, `X-Context-Budget`, `X-Context-Preserve-Recent`, `X-Context-Mode`,
`X-Context-Strategy`, `Idempotency-Key`) are checked here, before anything is stored; a bad one is a 400 naming it
(an unknown, repeated or empty strategy too). Response headers are the same on stream and non-stream answers, on
every door, except `X-Context-Cached-Tokens`: the prompt tokens the upstream reported read from its prompt cache for
this answer, known only once the answer is whole, so sent on non-stream answers only (a stream's headers leave
before its usage; the stream's own usage event and `GET /sessions/{id}` carry the figure).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from proxy.canonical.answers import Answer, Completed, ContextReport, Replayed, usage_text
from proxy.canonical.conversation import ContextMode, ContextOptions
from proxy.config.schema import STRATEGY_NAMES, parse_strategies
from proxy.cost import TokenCost
from proxy.errors import InvalidRequest
from proxy.numbers import MAX_STORED_INTEGER, parse_integer

MAX_SESSION_ID_LENGTH = 200
MAX_PRESERVE_RECENT = 1000
MAX_IDEMPOTENCY_KEY_LENGTH = 255
SESSION_ID_CHARACTERS = "ASCII letters, digits and . _ - ~ : @"
_SESSION_ID = re.compile(r"[A-Za-z0-9._~:@-]+")
"""Characters that read back unchanged in a URL path segment (`GET /sessions/{id}`) and in an HTTP header."""


def context_options(headers: Mapping[str, str]) -> ContextOptions:
    budget_text = headers.get("x-context-budget")
    reset = budget_text is not None and budget_text.strip().lower() == "none"
    mode = headers.get("x-context-mode", ContextMode.AUTO).strip().lower()
    if mode not in tuple(ContextMode):
        raise InvalidRequest(
            f"Header X-Context-Mode must be one of {', '.join(ContextMode)}, got {mode!r}.", param="X-Context-Mode"
        )
    return ContextOptions(
        session_id=_session_id(headers),
        budget=None if reset else _int_header(headers, "X-Context-Budget", minimum=1),
        reset_budget=reset,
        preserve_recent=_int_header(headers, "X-Context-Preserve-Recent", minimum=0, maximum=MAX_PRESERVE_RECENT),
        mode=ContextMode(mode),
        idempotency_key=_token_header(headers, "Idempotency-Key", MAX_IDEMPOTENCY_KEY_LENGTH),
        strategies=_strategies(headers),
    )


def _strategies(headers: Mapping[str, str]) -> tuple[str, ...] | None:
    value = headers.get("x-context-strategy")
    if value is None:
        return None
    names = parse_strategies(value) if len(value) <= 200 else None
    if names is None:
        shown = value if len(value) <= 60 else f"{value[:60]}…"
        raise InvalidRequest(
            f"Header X-Context-Strategy must be a comma-separated list of distinct strategies from "
            f"{', '.join(STRATEGY_NAMES)}, got {shown!r}.",
            param="X-Context-Strategy",
        )
    return names


def _token_header(headers: Mapping[str, str], name: str, max_length: int) -> str | None:
    value = headers.get(name.lower())
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > max_length or not value.isprintable():
        raise InvalidRequest(f"Header {name} must be 1 to {max_length} printable characters.", param=name)
    return value


def is_session_id(value: str) -> bool:
    """Whether `value` can name a session: 1-200 characters that read back unchanged from `/sessions/{id}`."""
    return 0 < len(value) <= MAX_SESSION_ID_LENGTH and _SESSION_ID.fullmatch(value) is not None


def _session_id(headers: Mapping[str, str]) -> str | None:
    """Refused at the door unless every character survives a round trip through a URL path and a header."""
    value = _token_header(headers, "X-Session-Id", MAX_SESSION_ID_LENGTH)
    if value is not None and _SESSION_ID.fullmatch(value) is None:
        raise InvalidRequest(
            f"Header X-Session-Id may contain only {SESSION_ID_CHARACTERS} (so that /sessions/{{id}} can serve it).",
            param="X-Session-Id",
        )
    return value


def _int_header(headers: Mapping[str, str], name: str, minimum: int, maximum: int | None = None) -> int | None:
    value = headers.get(name.lower())
    if value is None:
        return None
    number = parse_integer(value.strip())
    upper = MAX_STORED_INTEGER if maximum is None else maximum
    if number is None or not minimum <= number <= upper:
        limits = f"at least {minimum} and at most {upper}"
        shown = value if len(value) <= 40 else f"{value[:40]}… ({len(value)} characters)"
        raise InvalidRequest(f"Header {name} must be a whole number {limits}, got {shown!r}.", param=name)
    return number


REPLAY_HEADER = "X-Context-Replay"
CACHED_TOKENS_HEADER = "X-Context-Cached-Tokens"


def answer_headers(answer: Answer) -> dict[str, str]:
    """An answer's headers, on every door: what the proxy did with its context; for an Idempotency-Key replay,
    that it is one, and its session."""
    if isinstance(answer, Replayed):
        session_id = answer.report.session_id
        return {REPLAY_HEADER: "true", **({"X-Session-Id": session_id} if session_id else {})}
    headers = report_headers(answer.report)
    if isinstance(answer, Completed):
        usage = answer.response.get("usage")
        headers[CACHED_TOKENS_HEADER] = str(TokenCost.from_usage(usage if isinstance(usage, Mapping) else None).cached)
    return headers


def report_headers(report: ContextReport) -> dict[str, str]:
    return {
        "X-Session-Id": report.session_id,
        "X-Context-Tokens": str(report.prompt_tokens),
        "X-Context-Budget": str(report.budget),
        "X-Context-History-Tokens": str(report.history_tokens),
        "X-Context-Summaries": str(report.summaries),
        "X-Context-Recalled": str(report.recalled),
        "X-Context-Usage": usage_text(report.prompt_tokens, report.budget, report.summaries),
    }
