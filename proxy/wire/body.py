"""Reading a request body: within its size limit, as UTF-8 JSON, into an object every wire adapter validates.

Everything a client can get wrong about the bytes themselves is refused here with a 400 (or 413) before any
state is touched; what the fields mean is each wire adapter's business.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from proxy.errors import InvalidRequest, PayloadTooLarge, RequestTimeout


async def read_body(
    chunks: AsyncIterator[bytes], content_length: str | None, max_bytes: int, timeout_s: float | None = None
) -> bytes:
    """Read at most `max_bytes` within `timeout_s` (None: no deadline); a larger body is refused before (or as
    soon as) it is known to be too big, a slower one with a 408 that closes the connection."""
    if content_length is not None and content_length.isdigit() and int(content_length) > max_bytes:
        raise PayloadTooLarge(f"Request body is {content_length} bytes; the limit is {max_bytes} bytes.")
    received = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                received += chunk
                if len(received) > max_bytes:
                    raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
    except TimeoutError as exc:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout_s} s ({len(received)} bytes received)."
        ) from exc
    return bytes(received)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"Request body is not valid UTF-8 (byte {exc.start}).") from exc
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from exc
    except RecursionError as exc:
        raise InvalidRequest("The JSON body of your request is nested too deeply.") from exc
    except ValueError as exc:
        # Python refuses integers of more than 4,300 digits (`sys.get_int_max_str_digits`) with a ValueError.
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _reject_lone_surrogates(body)
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {json_type(body)}.")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A `\\ud800`–`\\udfff` escape: the only way a JSON text in valid UTF-8 can smuggle in a surrogate."""


def _reject_lone_surrogates(body: Any) -> None:
    """A surrogate escape not paired into one character is not Unicode: it could be neither hashed, stored nor
    echoed back (UTF-8 cannot encode it), so it is refused here like any other malformed input."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            "The JSON body of your request contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), "
            "which is not valid Unicode."
        ) from exc
    except RecursionError as exc:
        raise InvalidRequest("The JSON body of your request is nested too deeply.") from exc


def json_type(value: Any) -> str:
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
