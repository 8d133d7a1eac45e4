"""Every error the proxy reports, and the one place they become OpenAI-shaped bodies.

Clients are OpenAI SDKs: they pick their exception class from the HTTP status and read
`{"error": {"message", "type", "param", "code"}}`. So each failure is raised once as a `ProxyError` carrying
exactly those fields, foreign exceptions (LiteLLM's, SQLite's) are converted where they enter, and
`openai_error` below is the only function that turns an error into a status, body and headers.

    ProxyError                      status / type / code / param / headers
    ├── InvalidRequest              400 invalid_request_error, `param` names the field or header
    │   └── ContextTooLarge         400 context_length_exceeded (the recent messages alone do not fit)
    ├── AuthenticationFailed        401 invalid_api_key
    ├── NotFound                    404 model_not_found / session_not_found / ...
    ├── Conflict                    409 (an Idempotency-Key reused with another body)
    ├── PayloadTooLarge             413
    └── UpstreamError               the upstream's own status, type, code and Retry-After
"""

from __future__ import annotations

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


class InvalidRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class ContextTooLarge(InvalidRequest):
    code = "context_length_exceeded"


class AuthenticationFailed(ProxyError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Conflict(ProxyError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UpstreamError(ProxyError):
    """A failure the upstream reported (or caused); keeps its status so the client SDK reacts as to the provider."""


def openai_error(exc: BaseException) -> tuple[int, JSONBody, dict[str, str]]:
    """Status, OpenAI error body and extra headers for any exception that reaches a response."""
    if isinstance(exc, ProxyError):
        body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
        return exc.status, body, dict(exc.headers)
    # Not a known failure: say so without leaking internals (which could include keys or prompts).
    body = {
        "error": {
            "message": f"The proxy failed unexpectedly ({type(exc).__name__}); the failure was logged.",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    return 500, body, {}
