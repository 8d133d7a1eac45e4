"""The boundary where a foreign exception from an upstream call becomes the `UpstreamError` the client sees.

LiteLLM, the OpenAI SDK and httpx each raise their own classes, and LiteLLM wraps many failures of its own as
`APIConnectionError` or `InternalServerError`, so the class alone says little. `upstream_error` reads what the
upstream really said (its JSON error, status and Retry-After) and tells a refused or broken connection (502)
and a timeout (504) from an answer. Nothing else in the proxy inspects a foreign exception.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import openai

from proxy.errors import UpstreamError

log = logging.getLogger(__name__)

UPSTREAM_ERROR_PREFIX = "Exception - "
MAX_CAUSE_DEPTH = 16


def upstream_error(exc: BaseException, mid_stream: bool = False) -> UpstreamError:
    """The one conversion of a foreign exception from an upstream call into the error the client sees."""
    if isinstance(exc, UpstreamError):
        return exc
    log.debug("upstream call failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    # litellm.Timeout subclasses openai.APITimeoutError, so LiteLLM need not be imported here.
    if isinstance(exc, httpx.TimeoutException | openai.APITimeoutError):
        return UpstreamError(
            "The upstream model did not answer in time.",
            status=504,
            error_type="timeout",
            code="upstream_timeout",
        )
    status = getattr(exc, "status_code", None)
    message = str(getattr(exc, "message", None) or exc)
    body = _upstream_body(message)
    if _is_connection_failure(exc, body):
        return UpstreamError(
            "The upstream model could not be reached" + (" (the connection broke mid-stream)." if mid_stream else "."),
            status=502,
            error_type="upstream_error",
            code="upstream_unreachable",
        )
    if not isinstance(status, int) or not 400 <= status <= 599:
        status = 502
    headers = {}
    retry_after = _retry_after(exc)
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    error = body.get("error") if isinstance(body.get("error"), dict) else None
    if error is None:
        return UpstreamError(_strip_prefixes(message), status=status, error_type=_default_type(status), headers=headers)
    return UpstreamError(
        str(error.get("message") or _strip_prefixes(message)),
        status=status,
        error_type=str(error.get("type") or _default_type(status)),
        code=None if error.get("code") is None else str(error["code"]),
        param=None if error.get("param") is None else str(error["param"]),
        headers=headers,
    )


def _upstream_body(message: str) -> dict[str, Any]:
    """LiteLLM's httpx route keeps the upstream's JSON error only inside its message text."""
    start = message.find("{", max(message.find(UPSTREAM_ERROR_PREFIX), 0))
    if start < 0:
        return {}
    try:
        body, _end = json.JSONDecoder().raw_decode(message[start:])
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _is_connection_failure(exc: BaseException, body: Mapping[str, Any]) -> bool:
    """True when no upstream answered at all. LiteLLM wraps any failure of its own as APIConnectionError or
    InternalServerError, so the class says nothing: a transport error must be somewhere in the cause chain."""
    return not body and any(isinstance(cause, httpx.TransportError | OSError) for cause in _causes(exc))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < MAX_CAUSE_DEPTH:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _retry_after(exc: BaseException) -> str | None:
    for headers in (getattr(exc, "litellm_response_headers", None), getattr(exc, "headers", None)):
        if headers is None:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value:
            return str(value)
    return None


def _strip_prefixes(message: str) -> str:
    """`litellm.RateLimitError: RateLimitError: OpenAIException - text` → `text`."""
    index = message.rfind(UPSTREAM_ERROR_PREFIX)
    if index >= 0:
        message = message[index + len(UPSTREAM_ERROR_PREFIX) :]
    if message.startswith("litellm."):
        message = message.split(": ", 1)[-1]
    return message.strip() or "The upstream model failed."


def _default_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"
