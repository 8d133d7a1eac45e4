"""The boundary where a foreign exception from an upstream call becomes the `UpstreamError` the client sees.

LiteLLM, the OpenAI SDK and httpx each raise their own classes, and LiteLLM wraps many failures of its own as
`APIConnectionError` or `InternalServerError`, so the class alone says little. `upstream_error` reads what the
upstream really said (its JSON error, status and Retry-After) and tells a refused or broken connection (502)
and a timeout (504) from an answer. A refusal of the prompt as too long for the upstream's window, in any
provider's words (`proxy.upstream.context_window`), is marked `context_overflow` for the pipeline to heal, the
upstream's status, type and message kept for the client. Each failure is logged once, with its cause, so that
the operator can see why a request failed. Nothing else in the proxy inspects a foreign exception. The
upstream's text is redacted here (`proxy.upstream.redaction`), before it is logged, stored or sent: providers
echo the keys they refuse. It is also cut there to its first `MAX_TEXT_CHARS`, before any pattern reads it: an
error body can be any size. An answer that is not a chat completion at all (not JSON, SSE to a non-stream call,
chunks of the wrong shape) is a short 502 `upstream_malformed`, never the body or a Python exception's text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import openai

from proxy.errors import UpstreamError
from proxy.upstream.context_window import context_overflow
from proxy.upstream.redaction import MAX_TEXT_CHARS, NO_SECRETS, Redactor

log = logging.getLogger(__name__)

UPSTREAM_ERROR_PREFIX = "Exception - "
MAX_CAUSE_DEPTH = 16
MAX_CAUSE_CHARS = 200
UNREACHABLE = "upstream_unreachable"
TIMEOUT = "upstream_timeout"
MALFORMED = "upstream_malformed"
MALFORMED_MESSAGE = "The upstream's answer is not a valid chat completion (not JSON, or not in its shape)."
SHAPE_ERRORS = (json.JSONDecodeError, TypeError, AttributeError, KeyError, IndexError)
"""Raised while reading an answer that is not what its API says: the upstream's fault, not the proxy's."""
LITELLM_MALFORMED_WORDS = ("Invalid response object", "Unable to get json response", "LiteLLM: provider returned")
"""How LiteLLM says an answer could not be read as a completion (with the body, or a traceback, after it)."""
MARKER_SEARCH_CHARS = 300
ERROR_READ_BYTES = MAX_TEXT_CHARS + 4096
"""The most of an error body read: past the cap on what is kept of it, so that a cut body is marked as cut."""
KEY_STATUSES = frozenset({401, 403})
"""Statuses that may mean a missing or wrong provider key."""


class UpstreamRefusal(Exception):
    """An error answer an upstream gave over plain HTTP (the native clients), in the shape `upstream_error` reads:
    its status, its body as the message (JSON: the error object is taken from it), and its headers (Retry-After)."""

    def __init__(self, status_code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.headers = headers


def upstream_error(
    exc: BaseException,
    mid_stream: bool = False,
    *,
    model: str | None = None,
    missing_keys: str | None = None,
    redactor: Redactor = NO_SECRETS,
) -> UpstreamError:
    """The one conversion of a foreign exception from an upstream call into the error the client sees.

    `model` names the configured model in the log line; `missing_keys` is the sentence naming the provider keys
    it lacks (`proxy.upstream.credentials`), added to the error of a call that may have failed for want of
    them (unreachable, 401, 403). `redactor` holds the configured secrets; every text taken from `exc` passes
    through it. The debug line carries no traceback: it would repeat the upstream's words unredacted.
    """
    if isinstance(exc, UpstreamError):
        return exc
    log.debug("upstream call failed: %s: %s", type(exc).__name__, redactor.redact(str(exc)))
    error = _converted(exc, mid_stream, missing_keys, redactor)
    _log(error, model or "?", missing_keys)
    return error


def _converted(exc: BaseException, mid_stream: bool, missing_keys: str | None, redactor: Redactor) -> UpstreamError:
    # litellm.Timeout subclasses openai.APITimeoutError, so LiteLLM need not be imported here.
    if isinstance(exc, httpx.TimeoutException | openai.APITimeoutError):
        return UpstreamError(
            "The upstream model did not answer in time.",
            status=504,
            error_type="timeout",
            code=TIMEOUT,
        )
    status = getattr(exc, "status_code", None)
    message = redactor.redact(str(getattr(exc, "message", None) or exc))
    body = _upstream_body(message)
    cause = _transport_cause(exc) if not body else None
    cause = None if cause is None else redactor.redact(cause)
    if cause is not None:
        where = f"the connection broke mid-stream: {cause}" if mid_stream else cause
        return UpstreamError(
            _with_hint(f"The upstream model could not be reached ({where}).", missing_keys),
            status=502,
            error_type="upstream_error",
            code=UNREACHABLE,
        )
    if _malformed(exc, status, message):
        return malformed_answer()
    if not isinstance(status, int) or not 400 <= status <= 599:
        status = 502
    headers = {}
    retry_after = _retry_after(exc)
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    hint = missing_keys if status in KEY_STATUSES else None
    error = body.get("error") if isinstance(body.get("error"), dict) else None
    if error is None:
        text = _strip_prefixes(message)
        return UpstreamError(
            _with_hint(text, hint),
            status=status,
            error_type=_default_type(status),
            headers=headers,
            context_overflow=context_overflow(status, None, text, exc),
        )
    text = str(error.get("message") or _strip_prefixes(message))
    return UpstreamError(
        _with_hint(text, hint),
        status=status,
        error_type=redactor.redact(str(error.get("type") or _default_type(status))),
        code=None if error.get("code") is None else redactor.redact(str(error["code"])),
        param=None if error.get("param") is None else redactor.redact(str(error["param"])),
        headers=headers,
        context_overflow=context_overflow(status, error, text, exc),
    )


def malformed_answer(message: str = MALFORMED_MESSAGE) -> UpstreamError:
    """The error for an answer the proxy cannot read: a 502 with a short message of the proxy's own."""
    return UpstreamError(message, status=502, error_type="upstream_error", code=MALFORMED)


def _malformed(exc: BaseException, status: object, message: str) -> bool:
    """Whether the upstream answered, but not with something its API allows. A real error status is kept
    as the upstream's own (LiteLLM reports a 500 for an answer it could not convert, hence its words)."""
    head = message[:MARKER_SEARCH_CHARS]
    if any(words in head for words in LITELLM_MALFORMED_WORDS):
        return True
    if isinstance(status, int) and 400 <= status <= 599:
        return False
    return any(isinstance(cause, SHAPE_ERRORS) for cause in _causes(exc))


def _with_hint(message: str, hint: str | None) -> str:
    return message if hint is None else f"{message} {hint}"


def _log(error: UpstreamError, model: str, missing_keys: str | None) -> None:
    """One line that says why a call failed: the operator reads the log, not the client's screen.

    The upstream's own text is left out of 401/403 lines: some providers echo part of the key they refused.
    """
    if error.code in (UNREACHABLE, TIMEOUT):
        log.warning("upstream call for model %s failed: %s", model, error.message)
    elif error.status in KEY_STATUSES:
        log.warning(
            "upstream refused the credentials for model %s (%d %s).%s",
            model,
            error.status,
            error.code or error.type,
            f" {missing_keys}" if missing_keys else "",
        )
    elif error.status >= 500:
        log.warning("upstream call for model %s failed with %d: %s", model, error.status, error.message)
    elif error.context_overflow is None:
        log.info("upstream refused a request for model %s with %d: %s", model, error.status, error.message)


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


def _transport_cause(exc: BaseException) -> str | None:
    """Why no upstream answered at all, or None when one did. LiteLLM wraps any failure of its own as
    APIConnectionError or InternalServerError, so the class says nothing: a transport error must be somewhere
    in the cause chain, and its text (`[Errno 111] Connection refused`) is what the operator needs to read."""
    for cause in _causes(exc):
        if isinstance(cause, httpx.TransportError | OSError):
            text = str(cause).strip() or type(cause).__name__
            return text[:MAX_CAUSE_CHARS]
    return None


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
