"""Every error the proxy reports, raised once as a `ProxyError` that carries what any client needs to hear.

Each failure carries a status and OpenAI's fields (`message`, `type`, `param`, `code`), which the OpenAI SDKs
read from `{"error": {...}}` and pick their exception class by status. Foreign exceptions (LiteLLM's, SQLite's)
are converted where they enter (`proxy.upstream.failures` for the upstream). An error renders its own fields
(`ProxyError.fields`); each door puts them in its own shape, and `openai_error` below is that shape
for the OpenAI wire. Anything else that reaches a client becomes an `internal_error` that leaks nothing.

    ProxyError                      status / type / code / param / headers
    ├── ClientError                 type invalid_request_error
    │   ├── InvalidRequest          400, `param` names the field or header
    │   │   ├── ContextTooLarge     400 context_length_exceeded (the recent messages alone do not fit)
    │   │   └── TooManyValues       400 too_many_values (a body of more values than `limits.max_body_values`)
    │   ├── AuthenticationFailed    401 invalid_api_key
    │   ├── Forbidden               403 admin_disabled (an operator's route with no `auth.admin_keys` set)
    │   ├── NotFound                404 model_not_found / session_not_found / ...
    │   ├── RequestTimeout          408 (the body did not arrive within `server.body_timeout_s`; closes)
    │   ├── ClientTooSlow           408 client_too_slow (a stream's client fell too far behind; dropped)
    │   ├── Conflict                409 (an Idempotency-Key reused with another body)
    │   ├── PayloadTooLarge         413 request_too_large / message_too_large
    │   └── TooManySockets          429 too_many_sockets (a key's WebSockets past `server.max_sockets_per_key`)
    ├── UpstreamError               the upstream's own status, type, code and Retry-After; `context_overflow`
    │                               when it refused the prompt as longer than its context window
    ├── AnswerTooLarge              502 answer_too_large (the upstream's answer outgrew `limits.max_answer_chars`)
    ├── StorageFull                 507 storage_full (SQLite's "database or disk is full", from `proxy.store`)
    └── StoreUnavailable            503 store_unavailable (the store's server cannot be reached; Retry-After)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

JSONBody = dict[str, Any]


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if error_type is not None:
            self.type = error_type
        self.headers: dict[str, str] = headers or {}

    def fields(self) -> JSONBody:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class ClientError(ProxyError):
    """Something the client must change; OpenAI calls every such error `invalid_request_error`."""

    type = "invalid_request_error"


class InvalidRequest(ClientError):
    status = 400


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""OpenAI's code for a prompt over the model's window: ours when the recent messages cannot fit, and the one an
upstream answers when its tokenizer counted more than we did."""


class ContextTooLarge(InvalidRequest):
    code = CONTEXT_LENGTH_EXCEEDED


class TooManyValues(InvalidRequest):
    """A body holding more JSON values than `limits.max_body_values`, refused as soon as the scan passes it."""

    code = "too_many_values"


class AuthenticationFailed(ClientError):
    """The connection is closed after it: the request's body is never read, and a client without a key must not
    keep a socket by dripping the rest of it."""

    status, code = 401, "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})


class Forbidden(ClientError):
    status, code = 403, "admin_disabled"


class NotFound(ClientError):
    status, code = 404, "not_found"


class RequestTimeout(ClientError):
    """The request body came too slowly; the connection is closed, as what is left of the body is unread."""

    status, code = 408, "request_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})


class ClientTooSlow(ClientError):
    """A stream's client fell further behind than its relay holds for it (`proxy.journal.relay`) and did not catch
    up within `server.write_timeout_s`: it is dropped; the answer is still journaled to its end."""

    status, code = 408, "client_too_slow"


class Conflict(ClientError):
    status, code = 409, "conflict"


class PayloadTooLarge(ClientError):
    status, code = 413, "request_too_large"


class TooManySockets(ClientError):
    """A key already holds `server.max_sockets_per_key` WebSockets: the handshake is refused until one closes."""

    status, code = 429, "too_many_sockets"


@dataclass(frozen=True)
class ContextOverflow:
    """The upstream refused the prompt as longer than its context window, in whatever words it used.

    Wire-neutral on purpose: providers say it with a code (OpenAI's `context_length_exceeded`), a type
    (llama.cpp's `exceed_context_size_error`) or only a sentence, and the client still receives exactly what the
    upstream said. The counts are the upstream's own, when it reported them.
    """

    prompt_tokens: int | None = None
    """The prompt as the upstream's tokenizer counted it."""
    context_window: int | None = None
    """The window the upstream says it has (prompt and output together)."""
    wording: tuple[str, ...] = ()
    """The sentences of the upstream's message it was recognized by: an upstream that quotes the client's text
    (`Invalid value: '…'`) could be made to say them by the client (`proxy.upstream.context_window.unquoted`)."""
    coded: bool = False
    """Recognized by a field of the upstream's error object (a code or type), which no client text can set."""


class UpstreamError(ProxyError):
    """A failure the upstream reported (or caused); keeps its status so the client SDK reacts as to the provider."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
        context_overflow: ContextOverflow | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code, status=status, error_type=error_type, headers=headers)
        self.context_overflow = context_overflow
        """Set when the upstream refused the prompt as too long for its window: the pipeline heals on it."""


class AnswerTooLarge(ProxyError):
    """The upstream's answer outgrew `limits.max_answer_chars`: cut off there; what came is kept in its step."""

    status, type, code = 502, "upstream_error", "answer_too_large"

    def __init__(self, limit: int, step_id: int | None = None) -> None:
        kept = "" if step_id is None else f"; what arrived is kept in journal step {step_id}"
        super().__init__(
            f"The upstream's answer exceeded {limit} characters (limits.max_answer_chars) and was cut off{kept}."
        )
        self.limit = limit
        self.step_id = step_id
        """None where it is raised, before the step is known (an upstream body's reader): the pipeline sets it."""


class StorageFull(ProxyError):
    """The store could not grow (SQLite_FULL): the operator must free disk space; nothing of the write was kept
    (mid-stream: nothing after what was already journaled)."""

    status, code = 507, "storage_full"

    @classmethod
    def mid_stream(cls, step_id: int) -> StorageFull:
        """A stream cut off by a full store: what was relayed before this point was journaled and is kept."""
        return cls(
            "The proxy's storage is full: the answer was cut off here. What was relayed before this point is kept "
            f"(journal step {step_id}); the rest was not saved. The operator must free disk space."
        )


class StoreUnavailable(ProxyError):
    """The store's server cannot be reached (PostgreSQL down or restarting, a wrong URL or password); the client
    may retry once the store is back (`proxy.store.outage`). Raised by the store, it says no answer was saved;
    once the request's journal step exists, `in_step` says what that step kept."""

    status, code = 503, "store_unavailable"
    commit_unknown = False
    """Set on a write whose server went away during its transaction: whether it committed cannot be known."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers=headers or {"Retry-After": str(max(1, round(retry_after_s)))})

    def in_step(self, step_id: int, kept: StepKept) -> StoreUnavailable:
        """The error for a request whose step `step_id` was begun: what it kept, and that this process records
        the step as failed once the store is back (`Recovery.settle_unrecorded`)."""
        return StoreUnavailable(
            f"The proxy's store became unreachable while this request was answered: {kept.value} It is not part of "
            f"the conversation; journal step {step_id} holds the request and is recorded as failed once the store is "
            "back. Retry shortly.",
            headers=self.headers,
        )


class StepKept(enum.Enum):
    """What a step cut off by a store outage holds of its answer, as its client is told (`StoreUnavailable`)."""

    NOTHING = "the answer was not saved."
    RELAYED = "the answer was cut off here; what was relayed before this point is kept, the rest was not saved."
    WHOLE = "the answer was relayed whole and is kept, but the store could not end the step."


def error_fields(exc: BaseException) -> JSONBody:
    """OpenAI's error fields for any exception: a `ProxyError`'s own, or an opaque `internal_error`."""
    if isinstance(exc, ProxyError):
        return exc.fields()
    # Not a known failure: say so without leaking internals (which could include keys or prompts).
    return {
        "message": f"The proxy failed unexpectedly ({type(exc).__name__}); the failure was logged.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }


def openai_error(exc: BaseException) -> tuple[int, JSONBody, dict[str, str]]:
    """Status, OpenAI error body and extra headers for any exception that reaches a response."""
    if isinstance(exc, ProxyError):
        return exc.status, {"error": exc.fields()}, dict(exc.headers)
    return 500, {"error": error_fields(exc)}, {}


def json_type(value: Any) -> str:
    """How an error names a JSON value's type: `expected a string, but got a number`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
