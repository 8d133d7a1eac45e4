"""The X-Context-* headers every door shares: the options a request sets, and the report its answer carries.

Request headers (`X-Session-Id`, `X-Context-Budget`, `X-Context-Preserve-Recent`, `X-Context-Mode`,
`Idempotency-Key`) are checked here, before anything is stored; a bad one is a 400 naming it. Response headers
are the same on stream and non-stream answers, on every door.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.conversation import ContextMode, ContextOptions, ContextReport
from proxy.errors import InvalidRequest

MAX_SESSION_ID_LENGTH = 200
MAX_PRESERVE_RECENT = 1000
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def context_options(headers: Mapping[str, str]) -> ContextOptions:
    budget_text = headers.get("x-context-budget")
    reset = budget_text is not None and budget_text.strip().lower() == "none"
    mode = headers.get("x-context-mode", ContextMode.AUTO).strip().lower()
    if mode not in tuple(ContextMode):
        raise InvalidRequest(
            f"Header X-Context-Mode must be one of {', '.join(ContextMode)}, got {mode!r}.", param="X-Context-Mode"
        )
    return ContextOptions(
        session_id=_token_header(headers, "X-Session-Id", MAX_SESSION_ID_LENGTH),
        budget=None if reset else _int_header(headers, "X-Context-Budget", minimum=1),
        reset_budget=reset,
        preserve_recent=_int_header(headers, "X-Context-Preserve-Recent", minimum=0, maximum=MAX_PRESERVE_RECENT),
        mode=ContextMode(mode),
        idempotency_key=_token_header(headers, "Idempotency-Key", MAX_IDEMPOTENCY_KEY_LENGTH),
    )


def _token_header(headers: Mapping[str, str], name: str, max_length: int) -> str | None:
    value = headers.get(name.lower())
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > max_length or not value.isprintable():
        raise InvalidRequest(f"Header {name} must be 1 to {max_length} printable characters.", param=name)
    return value


def _int_header(headers: Mapping[str, str], name: str, minimum: int, maximum: int | None = None) -> int | None:
    value = headers.get(name.lower())
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or int(text) < minimum or (maximum is not None and int(text) > maximum):
        limits = f"at least {minimum}" + (f" and at most {maximum}" if maximum is not None else "")
        raise InvalidRequest(f"Header {name} must be a whole number {limits}, got {value!r}.", param=name)
    return int(text)


def report_headers(report: ContextReport) -> dict[str, str]:
    return {
        "X-Session-Id": report.session_id,
        "X-Context-Tokens": str(report.prompt_tokens),
        "X-Context-Budget": str(report.budget),
        "X-Context-History-Tokens": str(report.history_tokens),
        "X-Context-Summaries": str(report.summaries),
        "X-Context-Usage": usage_text(report.prompt_tokens, report.budget, report.summaries),
    }


def usage_text(tokens: int, budget: int, summaries: int) -> str:
    """The compact gauge of `X-Context-Usage`: `2.1k / 129k (1%)`, `50k / 129k (39%) [2S]`."""
    percent = round(100 * tokens / budget) if budget > 0 else 100
    text = f"{compact_count(tokens)} / {compact_count(budget)} ({percent}%)"
    return f"{text} [{summaries}S]" if summaries else text


def compact_count(tokens: int) -> str:
    if tokens < 1000:
        return str(tokens)
    if tokens < 10_000:
        return f"{tokens / 1000:.1f}k".replace(".0k", "k")
    if tokens < 1_000_000:
        return f"{round(tokens / 1000)}k"
    return f"{tokens / 1_000_000:.1f}M".replace(".0M", "M")
