"""`proxy.observability.logs`: an access line's `?key=` is masked before any format sees it."""

from __future__ import annotations

import logging

from proxy.observability.logs import MASKED_KEY, JsonFormatter, MaskedQueryKeys, log_config

SECRET = "sk-query-key-0123456789"


def access_record(path: str) -> logging.LogRecord:
    args = ("127.0.0.1:5000", "POST", path, "1.1", 200)
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None)


def test_a_query_key_is_masked_in_an_access_line_and_the_rest_of_the_query_kept() -> None:
    record = access_record(f"/v1beta/models/m:streamGenerateContent?alt=sse&key={SECRET}")
    assert MaskedQueryKeys().filter(record)
    line = record.getMessage()
    assert SECRET not in line
    assert f"?alt=sse&{MASKED_KEY}" in line
    assert SECRET not in JsonFormatter().format(record)


def test_other_parameters_ending_in_key_and_other_loggers_are_left_alone() -> None:
    record = access_record("/x?monkey=1&key_id=2")
    MaskedQueryKeys().filter(record)
    assert record.getMessage().endswith('/x?monkey=1&key_id=2 HTTP/1.1" 200')
    other = logging.LogRecord("proxy", logging.INFO, __file__, 1, "key=%s", ("v",), None)
    MaskedQueryKeys().filter(other)
    assert other.getMessage() == "key=v"


def test_the_process_log_config_masks_keys_on_its_handler() -> None:
    config = log_config("text", "info")
    assert config["handlers"]["stderr"]["filters"] == ["masked_keys"]
    assert config["filters"]["masked_keys"]["()"].endswith("MaskedQueryKeys")
