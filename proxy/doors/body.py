"""Reading a request body: within its size limit, as UTF-8 JSON, into an object every door validates.

Everything a client can get wrong about the bytes themselves is refused here with a 400 (or 413) before any
state is touched; what the fields mean is each door's business.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request

from proxy.canonical.pieces import Pieces, Reading, Received
from proxy.config.schema import DEFAULT_MAX_BODY_VALUES, Config, RequestLimits
from proxy.doors.json_values import COUNT_PIECE_CHARS, ValueCount, count_chars
from proxy.errors import InvalidRequest, PayloadTooLarge, ProxyError, RequestTimeout, json_type
from proxy.numbers import parse_integer
from proxy.offload import OFF_LOOP_CHARS, Lane, compute

T = TypeVar("T")

MAX_NESTING_DEPTH = 100
"""Arrays and objects inside one another, anywhere in the body. Far above any real tool schema or content
part; far below Python's recursion limit, which hashing and normalizing a message would otherwise reach."""

C_PARSE_MAX_BYTES = 8 * 1024 * 1024
C_PARSE_MAX_COMMAS = 50_000
"""Past either, a body goes through the pure-Python scanner (`parse_json_object`). A 5,000-message
conversation holds ~15,000 commas; the C parser takes ~0.2 µs a value and ~1.7 ms a MB of strings."""


async def read_body(
    chunks: AsyncIterator[bytes],
    content_length: str | None,
    max_bytes: int,
    timeout_s: float | None = None,
    earlier: Iterable[Pieces] = (),
) -> Received:
    """Read at most `max_bytes` within `timeout_s` (None: no deadline); a larger body is refused before (or as
    soon as) it is known to be too big, a slower one with a 408 that closes the connection. Each chunk is
    compared with the `earlier` bodies as it arrives: what the body repeats of one of them is not kept again
    (`proxy.canonical.pieces`)."""
    if content_length is not None and content_length.isascii() and content_length.isdigit():
        declared = parse_integer(content_length)  # None: more bytes than any store could count
        if declared is None or declared > max_bytes:
            shown = content_length if declared is not None else "more than 2^63"
            raise PayloadTooLarge(f"Request body is {shown} bytes; the limit is {max_bytes} bytes.")
    reading = Reading(earlier)
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
                reading.add(chunk)
    except TimeoutError as exc:
        raise RequestTimeout(f"The request body did not arrive within {timeout_s} s ({size} bytes received).") from exc
    return reading.received()


async def request_body(
    request: Request, config: Config, max_bytes: int | None = None, earlier: Iterable[Pieces] = ()
) -> Received:
    """A request's body within `limits.max_body_bytes` (or a smaller `max_bytes`) and `server.body_timeout_s`."""
    limit = config.request_limits.max_body_bytes if max_bytes is None else max_bytes
    return await read_body(
        request.stream(), request.headers.get("content-length"), limit, config.server.body_timeout_s, earlier
    )


B = TypeVar("B", Received, bytes)


async def parse_off_loop(raw: B, parse: Callable[[B], T], lane: Lane | None = None) -> T:
    """A door's `parse` of a body: in a worker thread when what is new in it is large (`proxy.offload`), in
    the doors' `lane` (one at a time) when given."""
    size = raw.fresh if isinstance(raw, Received) else len(raw)
    if lane is None:
        return await compute(size, _unburdened, parse, raw)
    return await lane.compute(size, _unburdened, parse, raw)


def _unburdened(parse: Callable[[B], T], raw: B) -> T:
    """`parse(raw)`; a refusal leaves without the frames it was raised in, so that what they held (the body's
    text, what was parsed of it: ~20 ms to free for a 31 MB body) is freed here, not on the event loop."""
    try:
        return parse(raw)
    except ProxyError as exc:
        seen: set[int] = set()
        cause: BaseException | None = exc
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            cause.__traceback__ = None
            cause = cause.__cause__ or cause.__context__
        raise


def parse_json_object(raw: bytes, max_values: int = DEFAULT_MAX_BODY_VALUES) -> dict[str, Any]:
    """The body as a JSON object of at most `max_values` values (`proxy.doors.json_values`). The C parser holds
    the GIL for the whole document (0.5 s for 800,000 tiny messages), so a body of many values (`c_parse_ok`)
    is parsed by the standard library's pure-Python scanner (strings still go through its C `scanstring`): its
    caller runs it in a thread (`parse_off_loop`), and Python code gives the event loop its turn every few
    milliseconds. A real conversation is mostly strings: the C parser reads 5,000 messages (~5 MB) in ~8 ms,
    the pure-Python scanner in ~25 ms."""
    text = decoded(raw)
    non_finite: list[str] = []
    try:
        body = json_decoder(text, non_finite, ValueCount(text, 0, max_values)).decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from exc
    except RecursionError as exc:
        raise InvalidRequest("The JSON body of your request is nested too deeply.") from exc
    except ValueError as exc:
        # Python refuses integers of more than 4,300 digits (`sys.get_int_max_str_digits`) with a ValueError.
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    return checked_object(body, text, non_finite)


def decoded(raw: bytes) -> str:
    """The body as text; a 400 when it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"Request body is not valid UTF-8 (byte {exc.start}).") from exc


def json_decoder(text: str, non_finite: list[str], count: ValueCount, start: int = 0) -> json.JSONDecoder:
    """The decoder for what of `text` is scanned (from `start`): its scanner (`scan_once`) the C one when that
    holds the GIL briefly enough and the text cannot hold more values than `count` may take; else the
    pure-Python one, which counts them (and stops past the limit)."""
    decoder = _decoder(non_finite)
    if not c_parse_ok(text, start, count):
        decoder.scan_once = count.scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def checked_object(body: Any, text: str, non_finite: list[str], start: int = 0) -> dict[str, Any]:
    """A parsed body refused for what JSON can spell but the proxy cannot pass on (a number that is not finite,
    noted in `non_finite` by `json_decoder`; a lone surrogate escape, looked for from `start`: the text before
    was checked with a request before), or for not being an object."""
    if non_finite:
        _reject_non_finite(body)
    if _surrogate_escape(text, start):
        _reject_lone_surrogates(body)
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {json_type(body)}.")
    return body


def c_parse_ok(text: str, start: int = 0, count: ValueCount | None = None) -> bool:
    """Whether the C parser's hold on the GIL is bounded (~20 ms) for `text` from `start`: a short text, or one
    of few values (each value but the first in an array or object follows a comma; counting them costs ~0.4 ms
    a MB); and whether the text holds no more values than `count` leaves room for (else they are counted)."""
    if count is not None and count.exact:
        return False
    size = len(text) - start
    if size <= OFF_LOOP_CHARS:
        return True
    return (
        size <= C_PARSE_MAX_BYTES and count_chars(text, ",", start, len(text), C_PARSE_MAX_COMMAS) <= C_PARSE_MAX_COMMAS
    )


def _decoder(non_finite: list[str]) -> json.JSONDecoder:
    """A decoder that notes, in `non_finite`, each number that is not finite: `NaN`, `Infinity` and `-Infinity`
    (Python's extensions to JSON) and numbers too large for a float (`1e999`); they are refused once the body
    is parsed (`_reject_non_finite`), never sent on as the invalid JSON Python would write back."""

    def constant(text: str) -> float:
        non_finite.append(text)
        return float(text)

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            non_finite.append(text)
        return value

    return json.JSONDecoder(parse_float=number, parse_constant=constant)


def _reject_non_finite(body: Any) -> None:
    """Refuse a body holding a number that is not finite, naming where the first one is."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            place = f"'{where}'" if where else "the body"
            shown = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            raise InvalidRequest(
                f"We could not parse the JSON body of your request: {place} is {shown}, which is not a finite "
                "number (JSON has no NaN or Infinity).",
                param=where or None,
            )
        if isinstance(value, dict):
            stack.extend((child, f"{where}.{key}" if where else key) for key, child in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((child, f"{where}[{index}]") for index, child in reversed(list(enumerate(value))))
    raise InvalidRequest("We could not parse the JSON body of your request: it holds a number that is not finite.")


def supported_values(values: Sequence[str]) -> str:
    """`'a', 'b', and 'c'`: the values an error says a field accepts, as OpenAI lists them."""
    quoted = [f"'{value}'" for value in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def part_type(part: Any, where: str, allowed: Sequence[str]) -> str:
    """A content part's `type`, one of `allowed`; else the 400 OpenAI gives (as the doors answer it)."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise InvalidRequest(f"'{where}' must be an object with a string 'type'.", param=where)
    kind: str = part["type"]
    if kind not in allowed:
        raise InvalidRequest(
            f"Invalid value: '{kind[:40]}'. Supported values are: {supported_values(allowed)}.",
            param=f"{where}.type",
            code="invalid_value",
        )
    return kind


MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
"""OpenAI's bounds on `metadata` (chat completions and Responses alike): 16 keys of at most 64 characters, each a
string of at most 512."""


def check_metadata(value: Any, where: str = "metadata") -> None:
    """OpenAI's `metadata` bounds (`MAX_METADATA_*`), refused as OpenAI refuses them: its upstream would refuse
    the request anyway, and nothing else would bound the member the proxy stores with every step."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"Invalid type for '{where}': expected an object, but got {json_type(value)} instead.",
            param=where,
            code="invalid_type",
        )
    if len(value) > MAX_METADATA_KEYS:
        raise InvalidRequest(
            f"Invalid '{where}': too many properties. Expected an object with at most {MAX_METADATA_KEYS} "
            f"properties, but got an object with {len(value)} properties instead.",
            param=where,
            code="object_above_max_properties",
        )
    for key, item in value.items():
        shown = key if len(key) <= MAX_METADATA_KEY_CHARS else key[:MAX_METADATA_KEY_CHARS] + "..."
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidRequest(
                f"Invalid property name in '{where}': '{shown}' is too long. Expected a string with maximum "
                f"length {MAX_METADATA_KEY_CHARS}, but got a string with length {len(key)} instead.",
                param=f"{where}.{shown}",
                code="property_name_above_max_length",
            )
        if not isinstance(item, str):
            raise InvalidRequest(
                f"Invalid type for '{where}.{key}': expected a string, but got {json_type(item)} instead.",
                param=f"{where}.{key}",
                code="invalid_type",
            )
        if len(item) > MAX_METADATA_VALUE_CHARS:
            raise InvalidRequest(
                f"Invalid '{where}.{key}': string too long. Expected a string with maximum length "
                f"{MAX_METADATA_VALUE_CHARS}, but got a string with length {len(item)} instead.",
                param=f"{where}.{key}",
                code="string_above_max_length",
            )


def check_shape(value: Any, where: str, limits: RequestLimits, depth: int = 1) -> int:
    """Refuse nesting deeper than `MAX_NESTING_DEPTH` (400); returns the characters of text `value` holds (its
    strings, keys included), which doors compare with `limits.max_message_chars`.

    Walked without recursion, so that the check itself cannot hit the limit it guards.
    """
    size = 0
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            size += len(item)
            continue
        if not isinstance(item, dict | list):
            continue
        if level > MAX_NESTING_DEPTH:
            raise InvalidRequest(
                f"The JSON body of your request is nested too deeply (more than {MAX_NESTING_DEPTH} levels).",
                param=where or None,
            )
        if isinstance(item, dict):
            size += sum(map(len, item))
            stack.extend((child, level + 1) for child in item.values())
        else:
            stack.extend((child, level + 1) for child in item)
    return size


def check_messages(messages: list[Any], param: str, limits: RequestLimits, start: int = 0) -> None:
    """The per-request limits on a door's message (or item) list: how many, and how big each one is (from
    `start` on: the ones before were checked in a request before, `proxy.doors.resent`)."""
    if len(messages) > limits.max_messages:
        raise InvalidRequest(
            f"'{param}' has {len(messages)} items; this proxy accepts at most {limits.max_messages} "
            "(limits.max_messages).",
            param=param,
            code="array_above_max_length",
        )
    for index in range(start, len(messages)):
        check_message_size(messages[index], f"{param}[{index}]", limits, depth=3)


def check_message_size(value: Any, param: str, limits: RequestLimits, depth: int = 2) -> None:
    """`limits.max_message_chars` on one message, or on text that becomes one (a Responses string `input` or
    `instructions`, a Messages `system`); a 413 naming `param`."""
    size = check_shape(value, param, limits, depth)
    if size > limits.max_message_chars:
        raise PayloadTooLarge(
            f"'{param}' holds {size} characters of text; this proxy accepts at most "
            f"{limits.max_message_chars} in one message (limits.max_message_chars).",
            param=param,
            code="message_too_large",
        )


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A `\\ud800`–`\\udfff` escape: the only way a JSON text in valid UTF-8 can smuggle in a surrogate."""


def _surrogate_escape(text: str, start: int) -> bool:
    """Whether `text` holds a surrogate escape from `start` on: searched a piece at a time (one search of a
    31 MB body held the GIL ~45 ms), each overlapping the next by more than an escape's length."""
    for at in range(start, len(text), COUNT_PIECE_CHARS):
        if _SURROGATE_ESCAPE.search(text, at, at + COUNT_PIECE_CHARS + 8) is not None:
            return True
    return False


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
